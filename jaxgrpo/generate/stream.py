"""A continuous-batching session fed prompt by prompt.

`ContinuousGenerator.generate` decodes a batch it knows in advance.
`SlotStream` decodes prompts that arrive while it runs: `add` queues a
prompt's G samples (row order within the prompt), `step` admits waiting
samples into the free slots (prefilling each prompt once into the prompt
stash), decodes one chunk and returns the samples that finished in it,
read back to the host. A streaming rollout (`rl.streaming`) adds prompts
as slots free up and scores each prompt's group as soon as its G samples
are back.

`unfinished` reads the samples still decoding or waiting when a session
ends; `add_group` queues some of a prompt's samples, each from the start
or part-way (its tokens so far, from an earlier session, perhaps under
other params). Part-way samples take free slots before any other: their
caches are rebuilt by `slots.resume` (prompt and tokens so far prefilled
as one sequence) and they decode on with the keys of their positions.

Samples draw with their per-sample keys (`generate.keys`), so a sample's
tokens do not depend on its slot, its batch-mates or when it was added.
The admission plan depends only on what was added and on the gathered
`active` flags, so every process of a multi-process run makes the same
decisions. Compilations: those of `ContinuousGenerator` for the same
prompt width, minus `flush`, plus one `slots.resume` per width
(`slots.resume_width`: at most `slots.RESUME_WIDTHS`) when samples resume.
"""

import collections
import dataclasses

from flax import nnx
import jax
import numpy as np

from jaxgrpo import sharding
from jaxgrpo.generate import continuous
from jaxgrpo.generate import keys as keys_lib
from jaxgrpo.generate import slots as slots_lib


@dataclasses.dataclass(frozen=True)
class Sample:
  """Sample `index` of prompt `prompt` (an `add` id): finished, or part-way
  (`unfinished`).

  Attributes:
    tokens: [T] int32, pad after the stop token (after `length` while it
      decodes).
    logps: [T] float32, sampling log-probs (0 on padding).
    length: generated tokens, the stop token included.
  """

  prompt: int
  index: int
  tokens: np.ndarray
  logps: np.ndarray
  length: int


def sample_key_data(prompt_keys_N: jax.Array, g: int) -> np.ndarray:
  """[N, G, K] uint32 host key data of N prompts' G sample keys
  (`keys.sample_key_data`)."""
  keys_R = keys_lib.sample_key_data(prompt_keys_N, g)
  return np.asarray(continuous.host(keys_R), np.uint32).reshape(
      prompt_keys_N.shape[0], g, -1)


class SlotStream:
  """Decodes samples in the engine's slots as prompts arrive.

  Attributes:
    engine: the slots, chunk, buckets and generator.
    slots: S, the same on every mesh (the slot arrays' rows past S,
      padding to the batch devices, stay idle).
    chunks: `step` calls that decoded.
    decode_steps: decode steps over all chunks.
    busy_slot_steps: slot-steps that produced a token.
  """

  def __init__(self, engine: continuous.ContinuousGenerator,
               params: nnx.State, prompt_width: int):
    gen = engine.generator
    self.engine, self.params, self.width = engine, params, prompt_width
    self.g = gen.num_samples
    self.slots = engine.slots
    # Slot rows past S (padding to the batch devices) never take a sample.
    self._rows = continuous.padded_slots(self.slots,
                                         sharding.batch_multiple())
    n_stash = -(-self.slots // self.g) + 1
    self._mesh = sharding.current()
    self._state, self._stash = slots_lib.init(
        gen, self._mesh, prompt_width, self._rows, n_stash)
    self._widths = engine.widths(prompt_width)
    self._prompts: dict[int, tuple] = {}  # id -> (tokens, mask, width)
    self._keys: dict[int, np.ndarray] = {}  # id -> [G, K] sample key data
    self._key_words = keys_lib.key_words()
    self._stop: dict[int, np.ndarray] = {}  # id -> [G] forced lengths
    self._waiting: collections.deque = collections.deque()  # (id, g)
    # Part-way samples, admitted first: (id, g, Sample so far).
    self._resuming: collections.deque = collections.deque()
    self._entry_of: dict[int, int] = {}
    self._free_entries = list(range(n_stash))
    self._left: dict[int, int] = {}  # id -> samples not yet admitted
    self._slot_sample = np.full(self.slots, -1, np.int64)  # id * G + g
    self._next_id = 0
    self.chunks = self.decode_steps = self.busy_slot_steps = 0

  @property
  def free_slots(self) -> int:
    """Slots that no waiting sample will take."""
    return (int((self._slot_sample < 0).sum()) - len(self._waiting)
            - len(self._resuming))

  @property
  def idle(self) -> bool:
    """Nothing decoding and nothing waiting."""
    return (not self._waiting and not self._resuming
            and not (self._slot_sample >= 0).any())

  def add(self, tokens_NP: np.ndarray, mask_NP: np.ndarray,
          prompt_keys_N: jax.Array,
          stop_at_NG: np.ndarray | None = None) -> list[int]:
    """Queues N prompts' G samples; returns the prompts' ids.

    Args:
      tokens_NP: int32 left-padded prompts, [N, P].
      mask_NP: bool, True on real prompt tokens, [N, P].
      prompt_keys_N: [N] keys (`keys.prompt_keys`).
      stop_at_NG: [N, G] forced lengths (see `Generator.prefill`), a
        benchmarking aid; None samples freely.
    """
    n = tokens_NP.shape[0]
    keys_NG2 = sample_key_data(prompt_keys_N, self.g)
    if stop_at_NG is None:
      stop_at_NG = np.zeros((n, self.g), np.int32)
    return [self.add_group(tokens_NP[i], mask_NP[i], keys_NG2[i],
                           stop_at_NG[i], dict.fromkeys(range(self.g)))
            for i in range(n)]

  def add_group(self, tokens_P: np.ndarray, mask_P: np.ndarray,
                keys_G2: np.ndarray, stop_at_G: np.ndarray,
                samples: dict[int, Sample | None]) -> int:
    """Queues some samples of one prompt; returns the prompt's id.

    Args:
      tokens_P: int32 left-padded prompt, [P].
      mask_P: bool, True on real prompt tokens, [P].
      keys_G2: [G, K] uint32, the key data of its G sample keys.
      stop_at_G: [G] int32 forced lengths (0: none).
      samples: index g -> None (decode from the start) or the sample so
        far (`unfinished`; 1 <= length < T: decode on from there).
    """
    real = int(mask_P.sum())
    if real < 1:
      raise ValueError('SlotStream: every prompt needs a real token')
    width = min(w for w in self._widths if w >= real)
    pid, self._next_id = self._next_id, self._next_id + 1
    self._prompts[pid] = (np.asarray(tokens_P, np.int32),
                          np.asarray(mask_P, bool), width)
    self._keys[pid] = np.asarray(keys_G2, np.uint32)
    self._stop[pid] = np.asarray(stop_at_G, np.int32)
    self._left[pid] = len(samples)
    for g, so_far in sorted(samples.items()):
      if so_far is None or not so_far.length:
        self._waiting.append((pid, g))
      else:
        self._resuming.append((pid, g, so_far))
    return pid

  def unfinished(self) -> list[Sample]:
    """Samples added and not yet ended: decoding (their tokens so far) or
    waiting (length 0, or what they had when queued), by id and index."""
    out = []
    if (self._slot_sample >= 0).any():
      host = continuous.host
      tokens, logps = host(self._state.tokens), host(self._state.logps)
      lengths = host(self._state.lengths)
      for slot in np.flatnonzero(self._slot_sample >= 0):
        s = int(self._slot_sample[slot])
        out.append(Sample(prompt=s // self.g, index=s % self.g,
                          tokens=np.array(tokens[slot]),
                          logps=np.array(logps[slot]),
                          length=int(lengths[slot])))
    out += [dataclasses.replace(so_far, prompt=pid, index=g)
            for pid, g, so_far in self._resuming]
    t = self.engine.max_new_tokens
    pad = self.engine.generator.pad_id
    out += [Sample(prompt=pid, index=g, tokens=np.full(t, pad, np.int32),
                   logps=np.zeros(t, np.float32), length=0)
            for pid, g in self._waiting]
    return sorted(out, key=lambda s: (s.prompt, s.index))

  def in_flight(self) -> dict[int, int]:
    """Tokens so far of each sample still decoding, by id * G + g."""
    lengths = continuous.host(self._state.lengths)
    return {int(s): int(lengths[slot])
            for slot, s in enumerate(self._slot_sample) if s >= 0}

  def step(self) -> list[Sample]:
    """Admits waiting samples, decodes a chunk; returns those that ended."""
    free = [s for s in range(self.slots) if self._slot_sample[s] < 0]
    resumed = [self._resuming.popleft()
               for _ in range(min(len(free), len(self._resuming)))]
    if resumed:
      self._resume(free[:len(resumed)], resumed)
      free = free[len(resumed):]
    admitted = self._next_waiting(len(free))
    self._prefill({pid for pid, _ in admitted} - set(self._entry_of))
    n = self._rows
    source = np.full(n, -1, np.int32)
    row = np.full(n, -1, np.int32)
    keys_S = np.zeros((n, self._key_words), np.uint32)
    stop_S = np.zeros(n, np.int32)
    for slot, (pid, g) in zip(free, admitted):
      self._slot_sample[slot] = pid * self.g + g
      source[slot], row[slot] = self._entry_of[pid], slot
      keys_S[slot], stop_S[slot] = self._keys[pid][g], self._stop[pid][g]
      self._admitted(pid)
    admission = continuous.replicated(slots_lib.Admission(
        source=source, row=row, keys=keys_S, stop_at=stop_S))
    self._state, ran, busy = slots_lib.chunk(
        self.engine.generator, self.engine.chunk, self._mesh, self.params,
        self._state, self._stash, admission)
    active = continuous.host(self._state.active)[:self.slots]
    self.chunks += 1
    self.decode_steps += int(continuous.host(ran))
    self.busy_slot_steps += int(continuous.host(busy))
    ended = np.flatnonzero((self._slot_sample >= 0) & ~active)
    if not ended.size:
      return []
    host = continuous.host
    tokens, logps = host(self._state.tokens), host(self._state.logps)
    lengths = host(self._state.lengths)
    out = []
    for slot in ended:
      s = int(self._slot_sample[slot])
      out.append(Sample(prompt=s // self.g, index=s % self.g,
                        tokens=np.array(tokens[slot]),
                        logps=np.array(logps[slot]),
                        length=int(lengths[slot])))
      self._slot_sample[slot] = -1
    return out

  def _next_waiting(self, n: int) -> list[tuple[int, int]]:
    """Up to `n` waiting samples, in order, whose prompts the stash holds
    or has a free entry for (prompts of fewer than G waiting samples, from
    `add_group`, can need more entries than a slot-full of whole groups);
    the next stop where a new prompt would find none."""
    out, new = [], set()
    while self._waiting and len(out) < n:
      pid = self._waiting[0][0]
      if pid not in self._entry_of and pid not in new:
        if len(new) == len(self._free_entries):
          break
        new.add(pid)
      out.append(self._waiting.popleft())
    return out

  def _admitted(self, pid: int) -> None:
    """Counts one of prompt `pid`'s samples admitted; frees it after all."""
    self._left[pid] -= 1
    if not self._left[pid]:
      if pid in self._entry_of:
        self._free_entries.append(self._entry_of.pop(pid))
      del self._keys[pid], self._stop[pid], self._prompts[pid]
      del self._left[pid]

  def _resume(self, free: list[int], resumed: list[tuple]) -> None:
    """Puts part-way samples into slots `free`, a few per `slots.resume`."""
    batch = self.engine.prefill_batch
    t = self.engine.max_new_tokens
    for i in range(0, len(resumed), batch):
      part = resumed[i:i + batch]
      pad = batch - len(part)
      rows = []
      for slot, (pid, g, so_far) in zip(free[i:i + batch], part):
        self._slot_sample[slot] = pid * self.g + g
        tokens_P, mask_P, _ = self._prompts[pid]
        rows.append((slot, tokens_P, mask_P, so_far.tokens, so_far.logps,
                     so_far.length, self._keys[pid][g], self._stop[pid][g]))
        self._admitted(pid)
      # Padding rows (one real token, one generated) go past the last
      # slot row: dropped.
      p = self.width
      rows += [(self._rows, np.zeros(p, np.int32), np.arange(p) == p - 1,
                np.zeros(t, np.int32), np.zeros(t, np.float32), 1,
                np.zeros_like(rows[0][6]), 0)] * pad
      cols = list(zip(*rows))
      rs = continuous.replicated(slots_lib.Resume(
          slot=np.array(cols[0], np.int32),
          prompt_tokens=np.stack(cols[1]).astype(np.int32),
          prompt_mask=np.stack(cols[2]).astype(bool),
          tokens=np.stack(cols[3]).astype(np.int32),
          logps=np.stack(cols[4]).astype(np.float32),
          lengths=np.array(cols[5], np.int32),
          keys=np.stack(cols[6]).astype(np.uint32),
          stop_at=np.array(cols[7], np.int32)))
      width = slots_lib.resume_width(t, max(int(n) for n in cols[5]))
      self._state = slots_lib.resume(self.engine.generator, self._mesh,
                                     width, self.params, self._state, rs)

  def _prefill(self, prompts: set[int]) -> None:
    """Prefills `prompts` into free stash entries, a few per call."""
    batch = self.engine.prefill_batch
    order = sorted(prompts)
    for i in range(0, len(order), batch):
      group = order[i:i + batch]
      for pid in group:
        self._entry_of[pid] = self._free_entries.pop(0)
      w = max(self._prompts[pid][2] for pid in group)
      pad = batch - len(group)
      n_stash = self._stash.lengths.shape[0]
      # Padding prompts (one real token) go to entry n_stash: dropped.
      tokens_AW = np.stack([self._prompts[pid][0][-w:] for pid in group]
                           + [np.zeros(w, np.int32)] * pad)
      mask_AW = np.stack([self._prompts[pid][1][-w:] for pid in group]
                         + [np.arange(w) == w - 1] * pad)
      dest_A = np.array([self._entry_of[pid] for pid in group]
                        + [n_stash] * pad, np.int32)
      inputs = continuous.replicated((tokens_AW, mask_AW, dest_A))
      self._stash = slots_lib.prefill(self.engine.generator, self._mesh,
                                      self.params, self._stash, *inputs)
