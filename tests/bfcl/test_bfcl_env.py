"""The BFCL environment token in, token out: its tokens are the chat template's rendering of the conversation,
hostile calls never raise and each gets an error result, and forks (snapshot or replay, as the engine drives them)
restore every API class's state at their anchor without touching the original's."""

import numpy as np
import pytest
from bfcl_replay import DONE, messages, plan, public_state

from trace_jax.envs.bfcl.apis import MAX_INT
from trace_jax.envs.bfcl.calls import MAX_CALL_CHARS
from trace_jax.envs.bfcl.chat import END_OF_MESSAGE, tools_of
from trace_jax.envs.bfcl.env import TRUNCATED, BfclEnv
from trace_jax.envs.bfcl.episode import Episode, reference

CLASSES = ("GorillaFileSystem", "MathAPI", "MessageAPI", "TwitterAPI", "TicketAPI", "TradingBot", "TravelAPI",
           "VehicleControlAPI")


class RecordingEnv(BfclEnv):
    """Records the public state of the episode each `act` is handed (the last one of a step: the step's own)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.seen = []

    def act(self, state, question, turn, action):
        self.seen.append(public_state(state.apis.instances))
        return super().act(state, question, turn, action)


def make_env(tokenizer, entries, cls=BfclEnv, **kw):
    return cls(tokenizer, entries, **{"max_turns": 64, "action_len": 8192, "obs_len": 8192, **kw})


def ids(env, text, close=True):
    end = [env.tokenizer.convert_tokens_to_ids(END_OF_MESSAGE)] if close else []
    return env.tokenizer.encode(text, add_special_tokens=False) + end


def drive(env, question, past, actions):
    """One env.step of one slot per action (all after the same `past`) -> [(obs ids, reward, done)]."""
    width = max(len(a) for a in actions)
    batch = np.zeros((len(actions), width), np.int32)
    for i, a in enumerate(actions):
        batch[i, : len(a)] = a
    obs, obs_len, reward, done = env.step(
        np.full(len(actions), question), np.full(len(actions), len(past)), np.ones(len(actions), bool), batch,
        np.array([len(a) for a in actions]), past_actions=[[np.asarray(p, np.int32) for p in past]] * len(actions))
    return [(obs[i, : obs_len[i]].tolist(), float(reward[i]), bool(done[i])) for i in range(len(actions))]


def play(env, question, texts):
    """The episode of `texts` through env.step, turn by turn with its history -> (token ids, reward, done)."""
    tokens, past = env.prompt_ids(question), []
    for text in texts:
        action = ids(env, text)
        ((obs, reward, done),) = drive(env, question, past, [action])
        tokens += action + obs
        past.append(action)
        if done:
            return tokens, reward, done
    return tokens, 0.0, False


@pytest.mark.parametrize("subset", ["base", "miss_func", "miss_param", "long_context"])
def test_tokens_are_the_chat_template(tokenizer, entries, subset):
    """The ground truth played through env.step scores 1, and prompt + (action + observation)* decodes to the chat
    template's rendering of the same conversation (tools in the system prompt, results as tool messages, the
    revealing user message at a held-out turn)."""
    entry = next(e for e in entries if e.subset == subset and sum(map(len, e.ground_truth)) <= 6)
    env = make_env(tokenizer, [entry])
    texts = messages(entry, plan(entry))
    tokens, reward, done = play(env, 0, texts)
    assert (reward, done) == (1.0, True)
    ref, episode = reference(entry), Episode.start(entry)
    conversation = [*map(dict, entry.turns[0])]
    for text in texts:
        conversation += [{"role": "assistant", "content": text}, *episode.step(text, entry, ref).messages]
    expected = tokenizer.apply_chat_template(conversation, tools=tools_of(entry.functions), tokenize=False)
    assert tokenizer.decode(tokens) + "\n" == expected


END = "the turn ends"  # bfcl's decoding finds no call in the message: the user turn ends (and fails its checks)


def _hostile(entry):
    """(assistant message, what its error says read leniently, what happens read as bfcl reads it: its error, END,
    or None where the call runs) for a miss_func entry over the file system at turn 0."""
    call = lambda body: f"<tool_call>\n{body}\n</tool_call>"
    nested = "[" * 30 + '"x"' + "]" * 30
    same = lambda body, says: (call(body), says, says)
    return [
        (call('{"name": "ls", "arguments": {"a": tru'), "not valid JSON", END),
        same('{"name": "__class__", "arguments": {}}', "no function named '__class__'"),
        same('{"name": "__init__", "arguments": {}}', "no function named '__init__'"),
        same('{"name": "_load_scenario", "arguments": {"scenario": {}}}', "no function named '_load_scenario'"),
        same('{"name": "__import__(\'os\').system(\'ls\')", "arguments": {}}', "no function named"),
        same('{"name": "place_order", "arguments": {}}', "no function named 'place_order'"),  # another class's
        same('{"name": "ls", "arguments": {"a": true, "b": 1}}', "ls has no argument b"),
        same('{"name": "cd", "arguments": {}}', "cd needs the argument folder"),
        same('{"name": "cd", "arguments": {"folder": {"x": 1}}}', "expected string, got object"),
        same(f'{{"name": "mkdir", "arguments": {{"dir_name": {nested}}}}}', "expected string, got array"),
        same(f'{{"name": "mkdir", "arguments": {{"dir_name": {MAX_INT * 10}}}}}', "does not fit in 64 bits"),
        same('{"name": "cd", "arguments": {"folder": 5}}', "'int' object has no attribute"),  # cd raises
        (call('{"name": "echo", "arguments": {"content": "' + "x" * MAX_CALL_CHARS + '", "file_name": "a"}}'),
         "over the limit", None),  # bfcl bounds no call's length (action_len bounds the message)
        (call('{"name": "ls", "arguments": {"a": ' + "[" * 50_000 + "]" * 50_000 + "}}"), "over the limit", END),
        (call('{"name": "ls", "arguments": "a=True"}'), "not a JSON object", END),
        ('<tool_call>\n{"name": "ls", "arguments": {}}', "not closed", END),
    ]


@pytest.mark.parametrize("decoding", ["lenient", "bfcl"])
def test_hostile_calls_get_error_results(tokenizer, entries, decoding):
    """Each hostile message, as its own slot of one env.step, gets one tool response, an error saying what is
    wrong (or, read as bfcl reads it, a message it finds no call in ends the turn), and leaves the APIs as they
    were; the same at the text level."""
    entry = next(e for e in entries if e.subset == "miss_func" and "GorillaFileSystem" in e.involved_classes)
    cases = [(text, lenient if decoding == "lenient" else bfcl) for text, lenient, bfcl in _hostile(entry)]
    cases = [(text, says) for text, says in cases if says is not None]
    env = make_env(tokenizer, [entry], cls=RecordingEnv, decoding=decoding,
                   action_len=max(len(tokenizer.encode(t)) for t, _ in cases) + 1)
    results = drive(env, 0, [], [ids(env, text) for text, _ in cases])
    ref, fresh = reference(entry), public_state(Episode.start(entry).apis.instances)
    assert sum(says == END for _, says in cases) == (4 if decoding == "bfcl" else 0)
    for (text, says), (obs, reward, done) in zip(cases, results):
        episode = Episode.start(entry, decoding)
        reply = episode.step(text, entry, ref)
        if says == END:
            assert (reward, done, len(obs)) == (0.0, True, 0) and reply.done
            assert episode.failure == "Model response list is empty for turn 0"
        else:
            seen = tokenizer.decode(obs)
            assert (reward, done) == (0.0, False) and seen.count("<tool_response>") == 1, seen
            assert "<tool_response>\nError during execution: " in seen and says in seen, (says, seen[:300])
            (message,) = reply.messages
            assert message["content"].startswith("Error during execution: ") and says in message["content"]
        assert public_state(episode.apis.instances) == fresh


def _fork_case(entries, cls):
    """(entry, anchor, ground-truth messages): the first base entry involving `cls` whose ground truth changes
    cls's public state after the anchor (the first message); any such entry for the stateless MathAPI."""
    for entry in entries:
        if entry.subset != "base" or cls not in entry.involved_classes:
            continue
        texts = messages(entry, plan(entry))
        states = [public_state(Episode.start(entry).apis.instances)[cls]]
        ref, episode = reference(entry), Episode.start(entry)
        for text in texts:
            episode.step(text, entry, ref)
            states.append(public_state(episode.apis.instances)[cls])
        if states[-1] != states[1] or cls == "MathAPI":
            return entry, 1, texts
    raise AssertionError(f"no base entry changes {cls}")


@pytest.mark.parametrize("cache_size", [4096, 0], ids=["snapshot", "replay"])
@pytest.mark.parametrize("cls", CLASSES)
def test_fork_restores_anchor_state(tokenizer, entries, cls, cache_size):
    """The original plays to its anchor; a fork from the anchor plays the rest of the conversation (rephrased: a
    different history); then the original goes on. Each step acts on exactly the state the text-level episode has
    there (the fork's first: the anchor's), the original's continuation sees none of the fork's changes, and both
    score 1."""
    entry, anchor, texts = _fork_case(entries, cls)
    ref, episode, oracle = reference(entry), Episode.start(entry), [public_state(Episode.start(entry).apis.instances)]
    for text in texts:
        episode.step(text, entry, ref)
        oracle.append(public_state(episode.apis.instances))
    env = make_env(tokenizer, [entry], cls=RecordingEnv, cache_size=cache_size)
    actions = [ids(env, t) for t in texts]
    fork_actions = [ids(env, "Sure. " + t) for t in texts]
    for k in range(anchor):
        drive(env, 0, actions[:k], [actions[k]])
        assert env.seen[-1] == oracle[k]
    for k in range(anchor, len(texts)):  # the fork: the anchor's history, then its own messages
        env.seen.clear()
        (_, reward, done), = drive(env, 0, actions[:anchor] + fork_actions[anchor:k], [fork_actions[k]])
        assert env.seen[-1] == oracle[k], (cls, "fork", k)
    assert (reward, done) == (1.0, True)
    for k in range(anchor, len(texts)):  # the original goes on from its anchor
        env.seen.clear()
        (_, reward, done), = drive(env, 0, actions[:k], [actions[k]])
        assert env.seen[-1] == oracle[k], (cls, "original", k)
    assert (reward, done) == (1.0, True)
    assert (env.hits > 0) == (cache_size > 0) and (env.replays > 0) == (cache_size == 0)


def test_out_of_turns_scores_zero(tokenizer, entries):
    entry = next(e for e in entries if e.subset == "base" and len(e.turns) >= 3)
    env = make_env(tokenizer, [entry], max_turns=2)
    tokens, reward, done = play(env, 0, messages(entry, plan(entry)))
    assert (reward, done) == (0.0, True)


def test_long_results_fit_obs_len(tokenizer, entries):
    """A result longer than obs_len is shortened inside its tool response; the observation still ends with the
    generation prompt. An action cut off before its end-of-message token gets one from the observation."""
    entry = next(e for e in entries if e.subset == "long_context" and e.involved_classes == ("GorillaFileSystem",))
    env = make_env(tokenizer, [entry], obs_len=64)
    call = '<tool_call>\n{"name": "find", "arguments": {}}\n</tool_call>'
    (closed, _, _), (open_, _, _) = drive(env, 0, [], [ids(env, call), ids(env, call, close=False)])
    tail = env.tokenizer.encode(f"{END_OF_MESSAGE}\n<|im_start|>assistant\n", add_special_tokens=False)
    for obs in (closed, open_):
        assert len(obs) <= 64 and obs[-len(tail):] == tail and TRUNCATED.strip() in tokenizer.decode(obs)
    assert not tokenizer.decode(closed).startswith(END_OF_MESSAGE)
    assert tokenizer.decode(open_).startswith(END_OF_MESSAGE + "\n<|im_start|>user\n<tool_response>\n")


def test_turn_ends_without_calls(tokenizer, entries):
    entry = next(e for e in entries if e.subset == "miss_param" and not e.ground_truth[0] and len(e.turns) > 1)
    env = make_env(tokenizer, [entry])
    ((obs, reward, done),) = drive(env, 0, [], [ids(env, DONE)])
    text = tokenizer.decode(obs)
    assert (reward, done) == (0.0, False)
    assert text == f"\n<|im_start|>user\n{entry.turns[1][0]['content']}{END_OF_MESSAGE}\n<|im_start|>assistant\n"
