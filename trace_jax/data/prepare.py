"""Building a TFDS dataset that this package generates (nothing is downloaded): TFDS's own lines around it
("Downloading and preparing dataset Unknown size (download: Unknown size, ...)", "... downloaded and prepared")
misname the work, so one line of ours says it instead (tests/test_cli.py checks that TFDS's are gone); TFDS's
progress bars and what the builders print stay."""

from __future__ import annotations

from pathlib import Path

import tensorflow_datasets as tfds


def prepare(builder: tfds.core.DatasetBuilder, what: str,
            download_config: tfds.download.DownloadConfig | None = None) -> Path:
    """Generates `builder`'s splits unless they are there already (`what` names them for the user); returns the
    version directory."""
    if not builder.is_prepared():
        print(f"building {what} in {builder.data_dir} (once)")
        builder._log_download_bytes = builder._log_download_done = lambda: None  # TFDS's two lines (stdout)
        builder.download_and_prepare(download_config=download_config)
    return Path(builder.data_dir)
