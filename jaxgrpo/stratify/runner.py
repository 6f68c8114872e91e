"""Samples K completions per training example and writes their pass rates.

The examples of a dataset that shard i of n owns are those whose index is
i mod n; they are taken in chunks of a fixed size, so chunk c of a shard
always holds the same examples and becomes one part file (`passrates`).
Chunk c of shard i of the dataset at config index d samples with the key
fold_in(fold_in(fold_in(key(seed), d), i), c): a run resumed after a crash
skips the chunks whose part exists and gives exactly the pass rates of a
run that never stopped.

Verifier failures (a call that raises, gives no reward in [0, 1] or times
out scores 0) are counted per run (`Counts`) and per part (its `verify`
description, summed per tag in summary.json). Such a call's 0 says nothing
of the model: an example's row counts only the calls the verifier answered
(`scored_rows`), and an example whose every call failed is named, and
readers give it no pass rate from that part (`passrates.read`) rather than
file it as hard for want of a verifier.

Size: the `run` command's whole path: its settings and their checks, the
checks of what an earlier run left in the output directory, the sampling
loop and the counts it reports.
"""

from collections.abc import Callable, Mapping, Sequence
import contextlib
import dataclasses
import hashlib
import json
import os
import time
from typing import Any, Protocol

import jax
import numpy as np
import tqdm

from jaxgrpo import build
from jaxgrpo import checkpoint as checkpoint_lib
from jaxgrpo import config_lib
from jaxgrpo import errors
from jaxgrpo import evaluate
from jaxgrpo import integrity
from jaxgrpo import model_spec
from jaxgrpo.data import loading
from jaxgrpo.data import sources
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.example import Example
from jaxgrpo.generate import sampling as sampling_lib
from jaxgrpo.generate.generator import Generator
from jaxgrpo.reporting import console
from jaxgrpo.stratify import passrates
from jaxgrpo.typing import PyTree
from jaxgrpo.verifiers import base
from jaxgrpo.verifiers import pool as verifier_pool

Log = Callable[[str], None]

# Part descriptions that must match for parts of one tag to be pooled:
# across all its datasets, and within one dataset.
# 'weights': a checksum of the params, so that a workdir trained again, or
# model files replaced, under the same name do not resume another model's
# parts (parts written before it was kept are not compared).
_SAME_FOR_TAG = ('policy', 'weights', 'k', 'seed', 'success_threshold',
                 'sampling')
_SAME_FOR_DATASET = ('fingerprint', 'chunk', 'verifier')


class SampleGenerator(Protocol):
  """What the runner samples with: a `Generator`, or a test stand-in."""

  num_samples: int

  def generate(self, params, tokens, mask, rng): ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
  """How examples are split, sampled and scored.

  Attributes:
    seed: the sampling seed (module docstring).
    threshold: a completion passes when its reward is >= this.
    max_prompt_len: P, the padded prompt length.
    truncate: cut longer prompts to their last tokens instead of failing.
    chunk: examples per part file, the unit of resume.
    batch: prompts per generator call.
    shard: this process's shard.
    num_shards: number of shards.
    limit: only the first `limit` examples of each dataset (None: all).
  """

  seed: int
  threshold: float
  max_prompt_len: int
  truncate: bool = False
  chunk: int = 256
  batch: int = 64
  shard: int = 0
  num_shards: int = 1
  limit: int | None = None

  def __post_init__(self):
    for name in ('chunk', 'batch', 'num_shards'):
      if getattr(self, name) < 1:
        raise errors.ConfigError(
            f'--{name}={getattr(self, name)}: must be >= 1')
    if not 0 <= self.shard < self.num_shards:
      raise errors.ConfigError(
          f'--shard={self.shard}: must be in [0, --num_shards='
          f'{self.num_shards})')
    if self.limit is not None and self.limit < 1:
      raise errors.ConfigError(f'--limit={self.limit}: must be >= 1')
    if not 0 < self.threshold <= 1:  # rewards lie in [0, 1]
      raise errors.ConfigError(f'--threshold={self.threshold}: must be in '
                               '(0, 1] (rewards lie in [0, 1])')


@dataclasses.dataclass
class Counts:
  """Examples sampled now and examples found done (resumed); of those
  sampled now, the verifier calls made, their failures (`stats`) and the
  examples where some but not all calls failed (`partly_failed`: their
  pass rates count the other calls only) and those whose every call
  failed, as (tag, dataset, id)."""

  done: int = 0
  resumed: int = 0
  calls: int = 0
  stats: base.ScoreStats = dataclasses.field(default_factory=base.ScoreStats)
  partly_failed: int = 0
  all_failed: list[tuple[str, str, str]] = dataclasses.field(
      default_factory=list)

  def add(self, other: 'Counts') -> None:
    self.done += other.done
    self.resumed += other.resumed
    self.calls += other.calls
    self.stats.add(other.stats)
    self.partly_failed += other.partly_failed
    self.all_failed += other.all_failed


def failure_lines(counts: Counts, out_dir: str) -> list[str]:
  """The lines that report the verifier failures of a run (none without
  any): their counts and, when every call of some example failed, those
  examples (the first 10 named; summary.json lists them all)."""
  verify = evaluate.verify_counts(counts.stats)
  if not any(verify.values()):
    return []
  lines = [f'stratify: verifier errors {verify["errors"]}, timeouts '
           f'{verify["timeouts"]} of {counts.calls} calls (scored 0), calls '
           f'that printed {verify["printed"]}, workers replaced '
           f'{verify["workers_replaced"]}']
  if counts.partly_failed:
    lines.append(
        f'stratify: {counts.partly_failed} examples had some verifier calls '
        'fail: their pass rates count only the calls the verifier answered')
  if counts.all_failed:
    named = ', '.join(f'{i} ({tag}, {d})' for tag, d, i in
                      counts.all_failed[:10])
    more = len(counts.all_failed) - 10
    lines.append(
        f'stratify: {len(counts.all_failed)} examples had every verifier '
        'call fail, so their pass rate of 0 would measure the verifier, not '
        'the model: they get no pass rate from it (jaxgrpo-stratify report '
        f'and curriculum.strata leave them unrated, not too_hard): {named}'
        + (f' and {more} more' if more > 0 else '') + ' (all of them in '
        f'{os.path.join(out_dir, passrates.SUMMARY)}: datasets.<dataset>.'
        'verify.<tag>.all_failed); fix the verifier and measure them again '
        'under another --out')
  return lines


def shard_chunks(total: int, settings: Settings) -> list[range]:
  """The example indices of each chunk of this shard, in order."""
  mine = range(settings.shard, total, settings.num_shards)
  return [mine[c:c + settings.chunk] for c in range(0, len(mine),
                                                    settings.chunk)]


def weights_digest(params: PyTree) -> str:
  """16 hex digits that change with any of the params' values."""
  return hashlib.sha256(json.dumps(
      integrity.digests(params), sort_keys=True).encode()).hexdigest()[:16]


def _check_compatible(out_dir: str, dataset: str, tag: str,
                      info: Mapping[str, Any]) -> None:
  """Fails when parts already there were made with other settings."""
  directory = passrates.tag_dir(out_dir, dataset, tag)
  shards = {n for (_, n, _) in passrates.list_parts(out_dir, dataset, tag)}
  other_shards = shards - {info['num_shards']}
  if other_shards:
    raise errors.UserError(
        f'{directory} holds parts of {min(other_shards)} shards, this run '
        f'has --num_shards={info["num_shards"]}; resume with the same '
        '--num_shards, or use another --out')
  # One part of each dataset describes all the tag's parts there.
  for other in passrates.layout(out_dir):
    paths = passrates.list_parts(out_dir, other, tag)
    if not paths:
      continue
    before = passrates.part_info(next(iter(paths.values())))
    keys = _SAME_FOR_TAG + (_SAME_FOR_DATASET if other == dataset else ())
    for key in keys:
      if key in before and before[key] != info[key]:
        what = {
            'fingerprint': 'the dataset changed since its parts were written',
            'weights': f'its parts were sampled from other weights under the '
                       f'name {info["policy"]!r} (the checkpoint or model '
                       'files changed since)'}.get(key) or (
                           f'its parts were written with {key}='
                           f'{before[key]!r}, this run has {info[key]!r}')
        raise errors.UserError(
            f'{passrates.tag_dir(out_dir, other, tag)}: {what}; use '
            'another --out, or the same settings to resume')


def stratify(
    out_dir: str,
    *,
    tag: str,
    info: Mapping[str, Any],
    generator: SampleGenerator,
    params: PyTree,
    tokenizer: tokenizer_lib.Tokenizer,
    scorer: verifier_pool.Scorer,
    datasets: Sequence[tuple[int, str, Sequence[Example]]],
    settings: Settings,
    progress: bool = True,
) -> Counts:
  """Writes the pass-rate parts of this shard that are not done yet.

  Length: its signature and docstring hold ten arguments; the code is one loop
  over the parts not yet written.

  Args:
    out_dir: the output directory.
    tag: the checkpoint's tag (its folder under each dataset).
    info: JSON-serialisable description of the checkpoint and sampling
      stored with each part (spec, policy, config, sampling, and
      'verifiers': each dataset's verifier spec, stored with its parts as
      'verifier'); 'k', 'seed', 'success_threshold' and the dataset's
      details are added here.
    generator: samples `generator.num_samples` = K completions per prompt.
    params: the model params passed to the generator.
    tokenizer: encodes prompts and decodes completions.
    scorer: scores completions against their examples.
    datasets: (config index, name, training examples) of each dataset.
    settings: sharding, chunking and sampling settings.
    progress: show a progress bar per dataset.

  Returns:
    The examples sampled now and those found done.
  """
  counts = Counts()
  k = generator.num_samples
  key = jax.random.key(settings.seed)
  for index, name, examples in datasets:
    total = len(examples)
    if settings.limit is not None:
      total = min(total, settings.limit)
    chunks = shard_chunks(total, settings)
    part_info = {
        **{key: v for key, v in info.items() if key != 'verifiers'},
        **({'verifier': checkpoint_lib.as_saved(info['verifiers'][name])}
           if name in info.get('verifiers', {}) else {}),
        'k': k, 'seed': settings.seed,
        'success_threshold': settings.threshold, 'dataset': name,
        'examples': total, 'fingerprint': sources.fingerprint(examples),
        'shard': settings.shard, 'num_shards': settings.num_shards,
        'chunk': settings.chunk,
    }
    _check_compatible(out_dir, name, tag, part_info)
    _remove_stale_tmp(out_dir, name, tag, settings)
    existing = passrates.list_parts(out_dir, name, tag)
    done = set()
    for c, members in enumerate(chunks):
      path = existing.get((settings.shard, settings.num_shards, c))
      # A part of an earlier run with a smaller --limit holds fewer rows
      # (made again), one with a larger --limit more (kept whole).
      if path and passrates.part_info(path)['rows'] >= len(members):
        done.add(c)
    resumed = sum(len(chunks[c]) for c in done)
    dataset_key = jax.random.fold_in(jax.random.fold_in(key, index),
                                     settings.shard)
    bar = tqdm.tqdm(total=sum(map(len, chunks)), initial=resumed,
                    desc=f'{tag} {name}', unit='ex', disable=not progress,
                    dynamic_ncols=True)
    with bar:
      for c, members in enumerate(chunks):
        if c in done:
          continue
        chunk = [examples[i] for i in members]
        stats, failed = base.ScoreStats(), np.zeros((len(chunk), k), bool)
        rewards = evaluate.sample_rewards(
            generator, params, tokenizer, chunk, scorer,
            jax.random.fold_in(dataset_key, c),
            max_prompt_len=settings.max_prompt_len,
            truncate=settings.truncate,
            # 20 examples are one call of 20 prompts, not of --batch.
            chunk_size=min(settings.batch, settings.chunk,
                           max(map(len, chunks))), stats=stats,
            failed=failed)
        all_failed = [ex.id for ex, f in zip(chunk, failed) if f.all()]
        trials, passes, mean_reward = scored_rows(rewards, failed,
                                                  settings.threshold)
        partly = int((failed.any(axis=1) & ~failed.all(axis=1)).sum())
        passrates.write_part(
            out_dir, name, tag, shard=settings.shard,
            num_shards=settings.num_shards, part=c,
            ids=[ex.id for ex in chunk], k=trials, passes=passes,
            mean_reward=mean_reward,
            info={**part_info, 'part': c, 'verify': {
                **evaluate.verify_counts(stats), 'calls': int(failed.size),
                'partly_failed': partly, 'all_failed': all_failed}})
        counts.add(Counts(done=len(chunk), calls=int(failed.size),
                          stats=stats, partly_failed=partly, all_failed=[
                              (tag, name, i) for i in all_failed]))
        bar.update(len(chunk))
    counts.resumed += resumed
  return counts


def scored_rows(rewards: np.ndarray, failed: np.ndarray, threshold: float
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(k, passes, mean_reward) of each example's row from its [E, K]
  rewards: only the calls whose verifier answered count, since a failed
  call's 0 says nothing of the model. A row whose every call failed keeps
  k = K, 0 passes and reward 0 (readers leave it out by its id in
  `verify.all_failed`)."""
  answered = ~failed
  trials = answered.sum(axis=1)
  none = trials == 0
  passes = ((rewards >= threshold) & answered).sum(axis=1)
  total = np.where(answered, rewards, 0.0).sum(axis=1)
  mean_reward = np.where(none, 0.0, total / np.maximum(trials, 1))
  return np.where(none, rewards.shape[1], trials), passes, mean_reward


def _remove_stale_tmp(out_dir: str, dataset: str, tag: str,
                      settings: Settings) -> None:
  """Removes the `*.tmp` files this shard left when it was killed."""
  directory = passrates.tag_dir(out_dir, dataset, tag)
  prefix = f'shard-{settings.shard:05d}-of-{settings.num_shards:05d}-'
  for name in os.listdir(directory) if os.path.isdir(directory) else ():
    if name.startswith(prefix) and name.endswith('.tmp'):
      os.remove(os.path.join(directory, name))


def tag_of(name: str) -> str:
  """A filesystem-safe label of a `LoadedModel.name`: 'init', the workdir's
  basename and step ('warm-step100', '数学-step3'), or the model file or
  folder name (`passrates.file_name`)."""
  if name == model_spec.INIT:
    return name
  path, sep, step = name.rpartition('@')
  if not sep or not step.isdigit():
    path, step = name, ''
  base = os.path.basename(path.rstrip('/')) or 'model'
  base = base.removesuffix('.gguf')
  label = f'{base}-step{step}' if step else base
  return passrates.file_name(label) or 'model'


def make_generator(cfg: config_lib.Config, model: model_spec.LoadedModel,
                   k: int) -> Generator:
  """The policy's generator, sampling as rollouts do, K per prompt."""
  ro = cfg.rollout
  tokenizer = model.tokenizer
  return Generator(
      graphdef=model.graphdef, model_cfg=model.model_cfg,
      sampling=sampling_lib.Sampling(
          temperature=ro.temperature, top_k=ro.top_k, top_p=ro.top_p),
      max_new_tokens=ro.max_new_tokens, num_samples=k,
      stop_tokens=tuple(getattr(tokenizer, 'stop_ids', (tokenizer.eos_id,))),
      pad_id=tokenizer.pad_id,
  )


def select_datasets(cfg: config_lib.Config,
                    datasets: Sequence[str] | None) -> list[str]:
  """The config's dataset names picked by --datasets (None: all of them).

  Raises:
    errors.ConfigError: a name the config does not have, or none at all.
  """
  names = [entry.name for entry in cfg.data.datasets]
  selected = list(names if datasets is None else datasets)
  unknown = [n for n in selected if n not in names]
  if unknown or not selected:
    what = f'{unknown[0]!r} is not a' if unknown else 'names no'
    raise errors.ConfigError(
        f'--datasets: {what} dataset of the config (it has '
        f'{", ".join(names)})')
  return selected


def run(
    cfg: config_lib.Config,
    checkpoints: Sequence[str],
    out_dir: str,
    *,
    k: int | None = None,
    datasets: Sequence[str] | None = None,
    seed: int | None = None,
    threshold: float | None = None,
    chunk: int = 256,
    batch: int = 64,
    shard: int | None = None,
    num_shards: int | None = None,
    limit: int | None = None,
    config_file: str = '',
    progress: bool = True,
    log: Log = console.print_line,
) -> Counts:
  """Measures the pass rates of each checkpoint on the config's datasets.

  Length: its signature and docstring hold fifteen arguments; the code checks
  them, then runs `stratify` once per checkpoint.

  Args:
    cfg: the validated config (datasets, verifiers, sampling settings).
    checkpoints: checkpoint specs (see `jaxgrpo.model_spec`).
    out_dir: where the parts and summary.json go.
    k: completions per example (default: rollout.group_size).
    datasets: names of the datasets to measure (default: all).
    seed: the sampling seed (default: the config's seed).
    threshold: reward a completion needs to pass (default:
      rollout.easy_threshold).
    chunk: examples per part file.
    batch: prompts per generator call.
    shard: this process's shard (default: jax.process_index()).
    num_shards: number of shards (default: jax.process_count()).
    limit: only the first `limit` examples of each dataset.
    config_file: the config file, recorded in the summary.
    progress: show progress bars.
    log: receives progress lines.

  Returns:
    The examples sampled now and those found done, over all checkpoints.

  Raises:
    errors.UserError: a bad checkpoint spec, dataset name or setting, or
      parts in `out_dir` written with other settings.
  """
  t0 = time.perf_counter()
  if not checkpoints:
    raise errors.ConfigError('--checkpoint: give at least one')
  k = cfg.rollout.group_size if k is None else k
  if k < 1:
    raise errors.ConfigError(f'--k={k}: must be >= 1')
  settings = Settings(
      seed=cfg.seed if seed is None else seed,
      threshold=(cfg.rollout.easy_threshold if threshold is None
                 else threshold),
      max_prompt_len=cfg.rollout.max_prompt_len,
      truncate=cfg.rollout.long_prompts == 'truncate',
      chunk=chunk, batch=batch,
      shard=jax.process_index() if shard is None else shard,
      num_shards=jax.process_count() if num_shards is None else num_shards,
      limit=limit)
  selected = select_datasets(cfg, datasets)
  # Every spec is checked, and its tag fixed, before any model loads; a
  # workdir's latest step is resolved once, here, so a run that saves a
  # checkpoint meanwhile does not change what is loaded.
  tags = {}
  for spec in checkpoints:
    name = model_spec.name_of(spec)
    tag = tag_of(name)
    if tag in tags:
      raise errors.ConfigError(
          f'--checkpoint {spec!r} and {tags[tag][0]!r} both get the tag '
          f'{tag!r}; give them distinct folder names')
    tags[tag] = (spec, name)
  sampling = {'temperature': cfg.rollout.temperature,
              'top_k': cfg.rollout.top_k, 'top_p': cfg.rollout.top_p,
              'max_new_tokens': cfg.rollout.max_new_tokens,
              'max_prompt_len': cfg.rollout.max_prompt_len,
              'long_prompts': cfg.rollout.long_prompts}
  counts = Counts()
  with contextlib.ExitStack() as resources:
    # The config's mesh, as training's; over several processes each
    # measures its own shard on its own device, with no collective.
    if jax.process_count() == 1:
      build.enter_mesh(cfg, log, resources)
    scorer = resources.enter_context(build.build_scorer(cfg))
    for tag, (spec, name) in tags.items():
      model = model_spec.load(name, cfg, log=log)
      identity = model.name
      if identity == model_spec.INIT:
        identity = (f'init:{cfg.model.path or cfg.model.preset}'
                    f':seed{cfg.seed}')
      loaded = [(i, entry.name,
                 loading.load_dataset(cfg, entry, model.tokenizer)[1])
                for i, entry in enumerate(cfg.data.datasets)
                if entry.name in selected]
      counts.add(stratify(
          out_dir, tag=tag,
          info={'spec': spec, 'policy': identity, 'config': config_file,
                'weights': weights_digest(model.params),
                'sampling': sampling, 'verifiers': {
                    entry.name: entry.verifier
                    for entry in cfg.data.datasets}},
          generator=make_generator(cfg, model, k), params=model.params,
          tokenizer=model.tokenizer, scorer=scorer, datasets=loaded,
          settings=settings, progress=progress))
  if passrates.layout(out_dir):
    passrates.write_summary(out_dir)
  log(f'stratify: {counts.done} examples sampled, {counts.resumed} resumed '
      f'(done before), K={k}, shard {settings.shard} of '
      f'{settings.num_shards}, in {time.perf_counter() - t0:.1f}s; pass '
      f'rates in {out_dir}')
  for line in failure_lines(counts, out_dir):
    log(line)
  return counts
