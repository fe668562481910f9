"""The synthetic language of the trained DDTree pair: exact conditionals, so every claim about the pair is computable.

A text is ``[BOS, topic, c_1, c_2, ...]``. Its content is a walk over *phrases* (fixed token strings);
inside a phrase the next token is certain, at the end of a phrase the next phrase is drawn from that
phrase's successors. Phrases belong to *motifs*, a pool shared by every topic; each topic strings a
different selection of motifs into a cycle, so where a motif's exit leads depends on the topic token at
the start of the text (a target that loses the prompt's first tokens, e.g. through a wrong prefix KV,
continues wrongly at every junction). Tokens are reused across phrases, so the next token depends on the
previous tokens too, not only on the current one (a wrong tree mask or wrong positions mix them up).

Motif kinds (``FORK``: 0.55 / 0.30 / 0.15; ``PAIR``: 0.65 / 0.35):

* ``plain``: one phrase;
* ``fork``: ``P -> {Q1, Q2, Q3}`` with ``FORK``, every ``Q`` exits (the branches reconverge at the next
  motif); ``Q1`` has two tokens, ``Q2`` three and ``Q3`` is ``Q2`` with another first token;
* ``flip``: ``P -> {Q1 = [a, b], Q2 = [c, b, y], Q3 = [d, b, y]}`` with ``FORK``, then
  ``Q1 -> {[x], [y]}`` with ``PAIR``; all exit. Three tokens after ``P`` the greedy path (``a b x``) holds
  0.55 * 0.65 = 0.36 of the mass and ``y`` 0.64, and from the fourth token every branch has reconverged:
  the drafter's per-position marginal puts its argmax off the target's greedy path there, so a chain
  (DFLASH) is cut where a tree (DDTREE) holding the runner-up is not -- under greedy decoding too -- and
  the tree's budget is not spread over continuations that differ. After ``b`` the next token depends on
  the token before ``b`` (``a``: x or y; ``c``, ``d``: y).

The first content token is the entry of one of the topic's motifs, uniformly; entry heads are distinct
within a topic and sibling heads are distinct, so a text has one parse and the conditional distribution
of its next token is exact (:meth:`Language.conditional`), as are the per-position marginals of its next
tokens (:meth:`Language.marginals`). The language never emits EOS. Token ids: 0 pad, 1 BOS, 2 EOS,
3..3+topics-1 topic tokens, then content up to ``vocab - 2``; ``vocab - 1`` is reserved (the drafter's
mask token) and never appears in a text.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass

PAD, BOS, EOS = 0, 1, 2
TOPIC0 = 3
FORK = (0.55, 0.30, 0.15)
PAIR = (0.65, 0.35)
KINDS = ("plain", "fork", "flip")

State = tuple[int, int, int]
"""(topic index, phrase id, offset of the last emitted token in the phrase)."""


@dataclass(frozen=True)
class Language:
    """A built language: phrases, motifs, per-topic motif cycles (JSON-serialisable via :meth:`to_json`)."""

    vocab: int
    n_topics: int
    phrases: tuple[tuple[int, ...], ...]
    internal: tuple[tuple[tuple[int, float], ...], ...]  # per phrase: successors inside its motif; () = exit
    motif_of: tuple[int, ...]  # per phrase: its motif
    motifs: tuple[tuple[str, int], ...]  # per motif: (kind, entry phrase)
    cycles: tuple[tuple[int, ...], ...]  # per topic: motif ids in cycle order

    @property
    def mask_token(self) -> int:
        return self.vocab - 1

    def topic_token(self, topic: int) -> int:
        return TOPIC0 + topic

    def content_tokens(self) -> range:
        return range(TOPIC0 + self.n_topics, self.vocab - 1)

    # -- transitions ------------------------------------------------------------------------------

    def successors(self, topic: int, phrase: int) -> tuple[tuple[int, float], ...]:
        """Phrases that may follow ``phrase`` under ``topic``, with their probabilities."""
        inside = self.internal[phrase]
        if inside:
            return inside
        cycle = self.cycles[topic]
        pos = cycle.index(self.motif_of[phrase])
        return ((self.motifs[cycle[(pos + 1) % len(cycle)]][1], 1.0),)

    def entries(self, topic: int) -> tuple[tuple[int, float], ...]:
        cycle = self.cycles[topic]
        return tuple((self.motifs[m][1], 1.0 / len(cycle)) for m in cycle)

    def step(self, state: State) -> list[tuple[int, float, State]]:
        """``(token, probability, next state)`` for every possible next token."""
        topic, phrase, offset = state
        words = self.phrases[phrase]
        if offset + 1 < len(words):
            return [(words[offset + 1], 1.0, (topic, phrase, offset + 1))]
        return [(self.phrases[nxt][0], p, (topic, nxt, 0)) for nxt, p in self.successors(topic, phrase)]

    # -- texts ------------------------------------------------------------------------------------

    def parse(self, tokens: Sequence[int]) -> State | None:
        """The state after ``tokens`` (``[BOS, topic, c_1, ...]`` with at least one content token), or
        None when they are not a text of the language."""
        if len(tokens) < 3 or tokens[0] != BOS:
            return None
        topic = int(tokens[1]) - TOPIC0
        if not 0 <= topic < self.n_topics:
            return None
        state = None
        for phrase, _ in self.entries(topic):
            if self.phrases[phrase][0] == tokens[2]:
                state = (topic, phrase, 0)
        if state is None:
            return None
        for tok in tokens[3:]:
            for nxt_tok, _, nxt in self.step(state):
                if nxt_tok == tok:
                    state = nxt
                    break
            else:
                return None
        return state

    def conditional(self, tokens: Sequence[int]) -> dict[int, float] | None:
        """The exact distribution of the token after ``tokens`` (None if they are not a text).

        After ``[BOS]`` it is uniform over the topic tokens; after ``[BOS, topic]`` uniform over the topic's
        motif entries."""
        if len(tokens) == 1 and tokens[0] == BOS:
            return {self.topic_token(t): 1.0 / self.n_topics for t in range(self.n_topics)}
        if len(tokens) == 2 and tokens[0] == BOS and 0 <= tokens[1] - TOPIC0 < self.n_topics:
            return {self.phrases[p][0]: w for p, w in self.entries(tokens[1] - TOPIC0)}
        state = self.parse(tokens)
        if state is None:
            return None
        out: dict[int, float] = {}
        for tok, p, _ in self.step(state):
            out[tok] = out.get(tok, 0.0) + p
        return out

    def states(self, tokens: Sequence[int]) -> list[State | None]:
        """The state after every prefix ``tokens[:i + 1]`` (None for the BOS and topic prefixes)."""
        out: list[State | None] = [None, None]
        state = self.parse(tokens[:3])
        if state is None:
            raise ValueError("not a text of the language")
        out.append(state)
        for tok in tokens[3:]:
            state = next(nxt for t, _, nxt in self.step(state) if t == tok)
            out.append(state)
        return out

    def next_distributions(self, tokens: Sequence[int]) -> list[dict[int, float]]:
        """The exact distribution of the token after every prefix ``tokens[:i + 1]``."""
        out = []
        for i, state in enumerate(self.states(tokens)):
            if state is None:
                out.append(self.conditional(tokens[:i + 1]))
            else:
                dist: dict[int, float] = {}
                for tok, p, _ in self.step(state):
                    dist[tok] = dist.get(tok, 0.0) + p
                out.append(dist)
        return out

    def marginals(self, state: State, depth: int) -> list[dict[int, float]]:
        """Per-position marginal distributions of the ``depth`` tokens after ``state`` (what an ideal
        block drafter predicts), by exact enumeration of the branches."""
        out: list[dict[int, float]] = []
        frontier: dict[State, float] = {state: 1.0}
        for _ in range(depth):
            nxt_frontier: dict[State, float] = {}
            dist: dict[int, float] = {}
            for st, w in frontier.items():
                for tok, p, nxt in self.step(st):
                    dist[tok] = dist.get(tok, 0.0) + w * p
                    nxt_frontier[nxt] = nxt_frontier.get(nxt, 0.0) + w * p
            out.append(dist)
            frontier = nxt_frontier
        return out

    def greedy(self, tokens: Sequence[int], n: int) -> list[int]:
        """The ``n`` tokens a greedy decoder of the exact conditionals emits after ``tokens``."""
        state = self.parse(tokens)
        if state is None:
            raise ValueError("not a text of the language")
        out = []
        for _ in range(n):
            tok, _, state = max(self.step(state), key=lambda x: x[1])
            out.append(tok)
        return out

    def sample(self, rng: random.Random, n_content: int, topic: int | None = None,
               entry: int | None = None) -> list[int]:
        """A text with ``n_content`` content tokens."""
        if topic is None:
            topic = rng.randrange(self.n_topics)
        entries = self.entries(topic)
        phrase = entries[rng.randrange(len(entries))][0] if entry is None else entry
        tokens = [BOS, self.topic_token(topic), self.phrases[phrase][0]]
        state: State = (topic, phrase, 0)
        while len(tokens) < n_content + 2:
            options = self.step(state)
            r, acc, pick = rng.random(), 0.0, len(options) - 1
            for i, (_, p, _) in enumerate(options):
                acc += p
                if r < acc:
                    pick = i
                    break
            tokens.append(options[pick][0])
            state = options[pick][2]
        return tokens

    def branches_at(self, state: State) -> bool:
        return len(self.step(state)) > 1

    # -- identity ---------------------------------------------------------------------------------

    def to_json(self) -> dict:
        return {"vocab": self.vocab, "n_topics": self.n_topics, "phrases": [list(p) for p in self.phrases],
                "internal": [[[s, p] for s, p in succ] for succ in self.internal], "motif_of": list(self.motif_of),
                "motifs": [[k, e] for k, e in self.motifs], "cycles": [list(c) for c in self.cycles]}

    @classmethod
    def from_json(cls, data: dict) -> Language:
        return cls(vocab=int(data["vocab"]), n_topics=int(data["n_topics"]),
                   phrases=tuple(tuple(int(t) for t in p) for p in data["phrases"]),
                   internal=tuple(tuple((int(s), float(p)) for s, p in succ) for succ in data["internal"]),
                   motif_of=tuple(int(m) for m in data["motif_of"]),
                   motifs=tuple((str(k), int(e)) for k, e in data["motifs"]),
                   cycles=tuple(tuple(int(m) for m in c) for c in data["cycles"]))

    def sha256(self) -> str:
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()


# -- building -------------------------------------------------------------------------------------


def build(seed: int = 0, vocab: int = 64, n_topics: int = 4,
          pool: Sequence[str] = ("plain",) * 3 + ("fork",) * 4 + ("flip",) * 5,
          cycle: Sequence[str] = ("flip", "fork", "flip", "plain", "flip", "fork", "flip")) -> Language:
    """A language from ``seed``: a motif pool of the ``pool`` kinds, and per topic a cycle of motifs of the
    ``cycle`` kinds drawn from that pool in a topic-specific order."""
    rng = random.Random(seed)
    content = list(range(TOPIC0 + n_topics, vocab - 1))
    phrases: list[tuple[int, ...]] = []
    internal: list[tuple[tuple[int, float], ...]] = []
    motif_of: list[int] = []
    motifs: list[tuple[str, int]] = []

    def words(n: int, first: int | None = None, avoid_first: Sequence[int] = ()) -> list[int]:
        out = [first] if first is not None else [rng.choice([t for t in content if t not in avoid_first])]
        while len(out) < n:
            t = rng.choice(content)
            if t != out[-1]:
                out.append(t)
        return out

    def add(motif: int, toks: Sequence[int]) -> int:
        phrases.append(tuple(toks))
        internal.append(())
        motif_of.append(motif)
        return len(phrases) - 1

    for m, kind in enumerate(pool):
        if kind == "plain":
            entry = add(m, words(rng.randint(3, 4)))
        elif kind == "fork":
            entry = add(m, words(2))
            q1 = words(2)
            q2 = words(3, avoid_first=[q1[0]])
            if q2[1] == q1[1]:
                q2[1] = next(t for t in content if t not in (q1[1], q2[0], q2[2]))
            q3 = words(1, avoid_first=[q1[0], q2[0], q2[1]]) + q2[1:]  # Q3 reconverges with Q2
            internal[entry] = tuple(zip((add(m, q1), add(m, q2), add(m, q3)), FORK, strict=True))
        elif kind == "flip":
            entry = add(m, words(2))
            a, b, c, d, x, y = rng.sample(content, 6)
            q1, q2, q3 = add(m, [a, b]), add(m, [c, b, y]), add(m, [d, b, y])
            internal[entry] = tuple(zip((q1, q2, q3), FORK, strict=True))
            internal[q1] = tuple(zip((add(m, [x]), add(m, [y])), PAIR, strict=True))
        else:
            raise ValueError(f"unknown motif kind {kind!r}")
        motifs.append((kind, entry))

    by_kind = {k: [m for m, (kind, _) in enumerate(motifs) if kind == k] for k in KINDS}
    cycles = []
    for _ in range(n_topics):
        for _attempt in range(1000):
            pools = {k: rng.sample(v, len(v)) for k, v in by_kind.items()}
            chosen = [pools[k].pop() for k in cycle]
            heads = [phrases[motifs[m][1]][0] for m in chosen]
            if len(set(heads)) == len(heads):
                break
        else:
            raise ValueError("no cycle with distinct entry heads; use another seed")
        cycles.append(tuple(chosen))
    lang = Language(vocab=vocab, n_topics=n_topics, phrases=tuple(phrases), internal=tuple(internal),
                    motif_of=tuple(motif_of), motifs=tuple(motifs), cycles=tuple(cycles))
    check(lang)
    return lang


def check(lang: Language) -> None:
    """The invariants the exact conditionals rely on (raises ValueError naming the first broken one)."""
    content = set(lang.content_tokens())
    for i, p in enumerate(lang.phrases):
        if not p or not set(p) <= content:
            raise ValueError(f"phrase {i} has tokens outside the content range: {p}")
    for i, succ in enumerate(lang.internal):
        heads = [lang.phrases[s][0] for s, _ in succ]
        if len(set(heads)) != len(heads):
            raise ValueError(f"phrase {i}: successors share a head token")
        if succ and abs(sum(p for _, p in succ) - 1.0) > 1e-9:
            raise ValueError(f"phrase {i}: successor probabilities do not sum to 1")
    for t, cyc in enumerate(lang.cycles):
        heads = [lang.phrases[lang.motifs[m][1]][0] for m in cyc]
        if len(set(heads)) != len(heads) or len(set(cyc)) != len(cyc):
            raise ValueError(f"topic {t}: entry heads or motifs repeat")


# -- prompts --------------------------------------------------------------------------------------


def prompts(lang: Language, n: int, kind: str, seed: int, min_len: int = 8, max_len: int = 128) -> list[list[int]]:
    """Prompts (token-id lists, BOS first) of the language.

    ``greedy``: texts cut at uniformly drawn lengths in ``[min_len, max_len]``. ``sampled``: texts cut
    right after a ``fork`` motif's branching phrase ``P`` (at least ``min_len`` tokens long): the first
    generated token has three continuations (0.55 / 0.30 / 0.15); Q1 is two tokens long and Q2, Q3 three,
    so the second to fifth generated tokens mix two continuations each (0.55 / 0.45): a chi-square over
    the first 3-5 generated positions has several categories with real mass at every position."""
    if kind not in ("greedy", "sampled"):
        raise ValueError(f"kind must be greedy or sampled, not {kind!r}")
    if not 3 <= min_len <= max_len:
        raise ValueError("need 3 <= min_len <= max_len")
    rng = random.Random(f"prompts-{kind}-{seed}")
    out = []
    while len(out) < n:
        if kind == "greedy":
            out.append(lang.sample(rng, rng.randint(min_len, max_len) - 2))
            continue
        text = lang.sample(rng, max_len - 2)
        cuts = []
        for end in range(max(min_len, 3), len(text) + 1):
            state = lang.parse(text[:end])
            kind_, entry = lang.motifs[lang.motif_of[state[1]]]
            if kind_ == "fork" and state[1] == entry and state[2] == len(lang.phrases[entry]) - 1:
                cuts.append(end)
        if cuts:
            out.append(text[:rng.choice(cuts)])
    return out
