"""The math family: tool-integrated reasoning with a sandboxed Python interpreter and a math-verify verifier."""
