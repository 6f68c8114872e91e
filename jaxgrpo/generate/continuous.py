"""Continuous batching: a fixed set of decode slots, refilled as rows end.

The static `Generator` decodes all R = B * G rows until the longest ends,
so with real completion lengths most rows idle most of the time.
`ContinuousGenerator` decodes S fixed slots instead: when a slot's sample
emits a stop token or reaches max_new_tokens, the slot takes the next
waiting sample (row order b * G + g). The loop is driven by the host:

  1. admission plan (host, numpy): the free slots, in increasing order,
     take the next waiting samples; prompts not yet prefilled are
     prefilled into a small prompt stash (`slots.prefill`, a few at a
     time);
  2. `slots.chunk` (one jitted call) copies each admitted sample's prompt keys
     and values from the stash into its slot, draws its first token from
     the stash's last-position logits, then decodes every slot for up to
     `chunk` steps (a while_loop that also stops once no slot is active);
  3. the host reads which slots are still active, `slots.flush` copies the
     finished slots' tokens to their rows of the output, and it repeats.

Design:
  * The G samples of a prompt share one prefill: the stash holds a prompt's
    keys and values until its G samples are all admitted, and each
    admission copies them into the sample's slot.
  * Slots keep their own cache positions: each slot writes its next key at
    its own column (`attention.update_cache` with a [S] index), so a slot's
    cache reads [prompt keys, generated keys] whatever the others do.
  * Shapes are static. Slot caches have P_max + T - 1 columns (P_max the
    input's prompt width); prompts are prefilled at the narrowest of the
    bucket widths (`buckets` below P_max, and P_max) holding their real
    tokens, `prefill_batch` prompts per call. Compilations per generator,
    mesh and (B, P_max) input: one `slots.init`, one `slots.chunk` and one
    `slots.flush` per slot width (S, or under a mesh S padded to a multiple
    of the batch devices, and each narrower width of the drain, at most
    1 + log2(S); one with `shrink=False`), one `slots.compact` per
    narrowing (at most log2(S)) and one `slots.prefill` per bucket width
    used; `chunk` and `prefill` do not depend on B.
  * Per-sample keys (`generate.keys`): token t of row b * G + g draws with
    fold_in(fold_in(prompt_keys[b], g), t), whatever its slot or
    batch-mates, which is how the static generator draws when given
    `prompt_keys`; the two then agree (up to float summation order where
    the prompt widths differ, see tests/generate/test_continuous.py).
  * Under a mesh the slots are split over the batch axes (the slot rows
    are padded to a multiple of the batch devices with idle rows that
    never take a sample, so S slots decode on every mesh and admit the
    same samples in the same order), the stash is replicated, and the
    host's plan depends only on the inputs and the gathered `active` flags,
    so every process of a multi-process run makes the same decisions.
  * One host round trip per chunk: larger chunks sync less but leave a
    finished slot idle for up to `chunk - 1` steps.
  * The drain (`shrink`): once no sample is waiting, the slots still
    decoding would share a step with ever more empty ones, while a decode
    step costs about the same per slot whether it is busy or not. When at
    most half of the S' slots are active (and half is still a multiple of
    the batch devices), `slots.compact` moves them into S' / 2 slots, so
    each step runs on fewer rows: at most log2(S) narrowings a call, and
    `chunk`, `flush` and `compact` compile once per width, so the
    compilations stay bounded (1 + log2(S) widths). A sample's tokens do
    not depend on its slot or on how many slots run beside it (up to float
    summation order, as for bucketed prefill).
"""

import dataclasses

from flax import nnx
import jax
import numpy as np

from jaxgrpo import multihost
from jaxgrpo import sharding
from jaxgrpo.generate import keys as keys_lib
from jaxgrpo.generate import slots as slots_lib
from jaxgrpo.generate.generator import Completions
from jaxgrpo.generate.generator import Generator
@dataclasses.dataclass(frozen=True)
class EngineStats:
  """What a continuous `generate` did.

  Attributes:
    chunks: `slots.chunk` calls (host round trips).
    prefill_calls: `slots.prefill` calls.
    decode_steps: decode steps run over all chunks.
    busy_slot_steps: slot-steps that produced a token.
    slots: S.
    slot_steps: slot-steps run, each decode step counting the slots it ran
      (S, or fewer once the drain narrowed them).
  """

  chunks: int
  prefill_calls: int
  decode_steps: int
  busy_slot_steps: int
  slots: int
  slot_steps: int

  @property
  def occupancy(self) -> float:
    """Share of slot-steps that produced a token."""
    return self.busy_slot_steps / max(self.slot_steps, 1)


# rollout.engine: how a round's completions are decoded.
ENGINES = ('static', 'continuous')

@dataclasses.dataclass(frozen=True, kw_only=True)
class ContinuousGenerator:
  """Samples like `generator`, decoding in `slots` continuously refilled slots.

  Hashable (a static jit argument). `generate` takes and returns what
  `Generator.generate` does, rows in the original order b * G + g.

  Attributes:
    generator: the model, sampling, T, G, stop and pad ids.
    slots: S, decode slots (on every mesh; idle rows pad the slot arrays
      to a multiple of the batch devices).
    chunk: decode steps per host round trip.
    buckets: prompt prefill widths; the input's width P is always one, and
      widths >= P are dropped.
    prefill_batch: prompts per prefill call.
    shrink: narrow the slots as the drain empties them (see above).
  """

  generator: Generator
  slots: int = 64
  chunk: int = 8
  buckets: tuple[int, ...] = (32, 64, 128, 256, 512)
  prefill_batch: int = 1
  shrink: bool = True

  def __post_init__(self):
    for name in ('slots', 'chunk', 'prefill_batch'):
      if getattr(self, name) < 1:
        raise ValueError(
            f'ContinuousGenerator.{name} must be >= 1, got '
            f'{getattr(self, name)}')
    object.__setattr__(self, 'buckets',
                       tuple(sorted({int(b) for b in self.buckets})))
    if any(b < 1 for b in self.buckets):
      raise ValueError(
          f'ContinuousGenerator.buckets must be >= 1, got {self.buckets}')

  @property
  def num_samples(self) -> int:
    return self.generator.num_samples

  @property
  def max_new_tokens(self) -> int:
    return self.generator.max_new_tokens

  def widths(self, prompt_width: int) -> tuple[int, ...]:
    """Prefill widths for inputs of width P: the buckets below P, then P."""
    return tuple(b for b in self.buckets if b < prompt_width) + (
        prompt_width,)

  def generate(self, params: nnx.State, prompt_tokens_BP: jax.Array,
               prompt_mask_BP: jax.Array, rng: jax.Array,
               **kwargs) -> Completions:
    """Samples G completions per prompt; see `generate_with_stats`."""
    return self.generate_with_stats(params, prompt_tokens_BP, prompt_mask_BP,
                                    rng, **kwargs)[0]

  def generate_with_stats(
      self,
      params: nnx.State,
      prompt_tokens_BP: jax.Array,
      prompt_mask_BP: jax.Array,
      rng: jax.Array,
      *,
      prompt_keys: jax.Array | None = None,
      stop_at: jax.Array | None = None,
  ) -> tuple[Completions, EngineStats]:
    """Samples G completions per prompt in continuously refilled slots.

    Length: the admission loop keeps its bookkeeping (free slots, stash entries,
    samples left per prompt, counters) in locals that every part of it updates.

    Args:
      params: Decoder params.
      prompt_tokens_BP: int32 left-padded prompts, [B, P], the same on every
        process.
      prompt_mask_BP: bool, True on real prompt tokens, [B, P].
      rng: PRNG key; prompt b's key is fold_in(rng, b) unless `prompt_keys`.
      prompt_keys: [B] keys (`keys.prompt_keys`), for draws that depend on
        the examples rather than their rows.
      stop_at: [R] int32, each row's length (see `Generator.prefill`); a
        testing and benchmarking aid.

    Returns:
      (Completions with R = B * G rows in order b * G + g and T columns,
      what the engine did).
    """
    gen = self.generator
    tokens_BP = np.asarray(host(prompt_tokens_BP), np.int32)
    mask_BP = np.asarray(host(prompt_mask_BP), bool)
    b, p = tokens_BP.shape
    gen.check_length(p)
    g, t = gen.num_samples, gen.max_new_tokens
    r = b * g
    keys_R, stop_R = self._row_inputs(b, rng, prompt_keys, stop_at)

    multiple = sharding.batch_multiple()
    n_slots = self.slots
    n_rows = padded_slots(n_slots, multiple)
    n_stash = -(-n_slots // g) + 1
    mesh = sharding.current()
    slots, stash = slots_lib.init(gen, mesh, p, n_rows, n_stash)
    out = slots_lib.init_out(gen.pad_id, r, t)

    widths = self.widths(p)
    real_B = mask_BP.sum(axis=1)
    if real_B.min(initial=1) < 1:
      raise ValueError('ContinuousGenerator: every prompt needs a real token')
    width_B = np.array([min(w for w in widths if w >= n) for n in real_B])
    entry_of: dict[int, int] = {}  # prompt -> stash entry
    free_entries = list(range(n_stash))
    left_B = np.full(b, g)  # samples of each prompt not yet admitted
    free = list(range(n_slots))
    width = n_rows  # slot rows now; fewer once the drain narrows them
    next_row = 0
    chunks = prefills = steps = busy = slot_steps = 0
    while True:
      rows = list(range(next_row, next_row + min(len(free), r - next_row)))
      next_row += len(rows)
      needed = sorted({row // g for row in rows} - set(entry_of))
      for i in range(0, len(needed), self.prefill_batch):
        group = needed[i:i + self.prefill_batch]
        for prompt in group:
          entry_of[prompt] = free_entries.pop(0)
        stash = self._prefill_group(params, stash, tokens_BP, mask_BP,
                                    width_B, group, entry_of)
        prefills += 1
      admission = _admission(width, dict(zip(free, rows)), g, entry_of,
                             keys_R, stop_R)
      for prompt in (row // g for row in rows):
        left_B[prompt] -= 1
        if not left_B[prompt]:
          free_entries.append(entry_of.pop(prompt))
      slots, chunk_steps, chunk_busy = slots_lib.chunk(
          gen, self.chunk, mesh, params, slots, stash, admission)
      out = slots_lib.flush(mesh, out, slots)
      active = host(slots.active)
      chunks += 1
      ran = int(host(chunk_steps))
      steps += ran
      slot_steps += ran * min(width, n_slots)
      busy += int(host(chunk_busy))
      if next_row == r and not active.any():
        break
      if next_row == r and self.shrink:
        slots, active = _narrow(mesh, slots, active, drain_width(
            width, int(active.sum()), multiple))
        width = active.size
      free = [s for s in range(min(width, n_slots)) if not active[s]]
    stats = EngineStats(chunks=chunks, prefill_calls=prefills,
                        decode_steps=steps, busy_slot_steps=busy,
                        slots=n_slots, slot_steps=slot_steps)
    return slots_lib.completions(out), stats

  def _row_inputs(self, b: int, rng: jax.Array, prompt_keys: jax.Array | None,
                 stop_at: jax.Array | None) -> tuple[np.ndarray, np.ndarray]:
    """Each row's sampling key (as uint32 key data) and forced stop length
    (0: none), on the host."""
    gen, r = self.generator, b * self.generator.num_samples
    if stop_at is not None and not gen.stop_tokens:
      raise ValueError('ContinuousGenerator: stop_at needs stop_tokens')
    stop_R = (np.zeros(r, np.int32) if stop_at is None
              else np.asarray(host(stop_at), np.int32).reshape(r))
    if prompt_keys is None:
      prompt_keys = keys_lib.row_prompt_keys(rng, b)
    keys_R = keys_lib.sample_key_data(prompt_keys, gen.num_samples)
    return np.asarray(host(keys_R), np.uint32), stop_R

  def _prefill_group(self, params, stash, tokens_BP, mask_BP, width_B, group,
                     entry_of) -> slots_lib.Stash:
    """Prefills prompts `group` into their stash entries, at one width."""
    n_stash = stash.lengths.shape[0]
    w = int(max(width_B[i] for i in group))
    pad = self.prefill_batch - len(group)
    # Padding prompts (one real token) go to entry n_stash: dropped.
    tokens_AW = np.concatenate(
        [tokens_BP[group, -w:], np.zeros((pad, w), np.int32)])
    mask_AW = np.concatenate(
        [mask_BP[group, -w:], np.arange(w)[None].repeat(pad, 0) == w - 1])
    dest_A = np.array([entry_of[i] for i in group] + [n_stash] * pad,
                      np.int32)
    inputs = replicated((tokens_AW, mask_AW, dest_A))
    return slots_lib.prefill(self.generator, sharding.current(), params,
                             stash, *inputs)


def _admission(width: int, row_of: dict[int, int], g: int,
               entry_of: dict[int, int], keys_R: np.ndarray,
               stop_R: np.ndarray) -> slots_lib.Admission:
  """The chunk's admissions: slot -> row (of prompt row // g, prefilled in
  stash entry `entry_of[prompt]`), the other slots -1."""
  source = np.full(width, -1, np.int32)
  row_S = np.full(width, -1, np.int32)
  keys_S = np.zeros((width,) + keys_R.shape[1:], np.uint32)
  stop_S = np.zeros(width, np.int32)
  for slot, row in row_of.items():
    source[slot], row_S[slot] = entry_of[row // g], row
    keys_S[slot], stop_S[slot] = keys_R[row], stop_R[row]
  return replicated(slots_lib.Admission(
      source=source, row=row_S, keys=keys_S, stop_at=stop_S))


def _narrow(mesh, slots: slots_lib.Slots, active: np.ndarray,
            narrow: int) -> tuple[slots_lib.Slots, np.ndarray]:
  """The slots halved down to `narrow`, live ones kept; one halving a call,
  so compilation happens per (S', S'/2) pair."""
  width = active.size
  while width > narrow:
    live = np.flatnonzero(active)
    keep = np.concatenate(
        [live, np.flatnonzero(~active)[:width // 2 - live.size]])
    slots = slots_lib.compact(mesh, slots, replicated(keep.astype(np.int32)))
    active, width = active[keep], width // 2
  return slots, active


def padded_slots(slots: int, multiple: int) -> int:
  """Slot rows for `slots` decode slots: a multiple of the batch devices;
  the rows past `slots` stay idle, so every mesh decodes in `slots`."""
  return -(-slots // multiple) * multiple


def drain_width(width: int, active: int, multiple: int) -> int:
  """The slots a drain keeps: `width` halved while half still holds the
  `active` samples and is a multiple of the batch devices."""
  while width % 2 == 0 and (width // 2) % multiple == 0 and (
      width // 2 >= max(active, 1)):
    width //= 2
  return width


def host(x) -> np.ndarray:
  """`x` as a host array on every process."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    if x.sharding.is_fully_replicated:
      return np.asarray(x.addressable_data(0))
    return multihost.to_host(x)
  return np.asarray(x)


def replicated(tree):
  """Host arrays placed replicated on the active mesh (as they are without)."""
  return sharding.shard(
      tree, jax.tree.map(lambda _: sharding.replicated(), tree)
      if sharding.active_mesh() is not None else None)
