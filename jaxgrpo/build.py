"""A training run's parts, built from its validated config.

Each builder turns config mistakes into a ConfigError naming the key:
the verifiers and their worker pool, a pretrained model, the device mesh,
and the compiled train step's memory check. `jaxgrpo.train` puts them
together; `jaxgrpo-eval` and `jaxgrpo-stratify` reuse the scorer and the
model loader.
"""

from collections.abc import Callable
import contextlib
import dataclasses
import importlib
import time

from etils import epath
import jax

from jaxgrpo import config_lib
from jaxgrpo import errors
from jaxgrpo import sharding
from jaxgrpo import train_state as train_state_lib
from jaxgrpo import train_step as train_step_lib
from jaxgrpo import verifiers
from jaxgrpo.model import config as model_config
from jaxgrpo.model import pretrained
from jaxgrpo.typing import TrainBatch
from jaxgrpo.verifiers import pool as verifier_pool

Log = Callable[[str], None]


def check_workdir(workdir: str) -> None:
  """Fails early, in one line, when the workdir cannot be written."""
  probe = epath.Path(workdir) / f'.jaxgrpo-write-test-{jax.process_index()}'
  try:
    probe.parent.mkdir(parents=True, exist_ok=True)
    probe.write_text('ok')
    probe.unlink()
  except OSError as e:
    raise errors.ConfigError(
        f'--workdir {workdir}: cannot write there ({e.strerror or e})'
    ) from None


def build_scorer(cfg: config_lib.Config) -> verifier_pool.Scorer:
  """Each dataset's verifier, scored per cfg.verify; errors name the key."""
  for i, module in enumerate(cfg.verify.imports):
    try:
      importlib.import_module(module)
    except ImportError as e:
      raise errors.ConfigError(
          f'verify.imports[{i}]={module!r}: cannot import it ({e})') from None
  built, names = {}, {}
  for i, entry in enumerate(cfg.data.datasets):
    key = f'data.datasets[{i}].verifier'
    try:
      built[entry.name] = verifiers.from_config(entry.verifier, key)
    except ValueError as e:
      raise errors.ConfigError(str(e)) from None
    names[entry.name] = _verifier_name(entry.verifier)
  try:
    return verifier_pool.Scorer(
        built, workers=cfg.verify.workers, timeout_s=cfg.verify.timeout_s,
        imports=cfg.verify.imports, names=names)
  except ValueError as e:
    raise errors.ConfigError(f'verify.workers={cfg.verify.workers}: {e}') from None


def load_pretrained(cfg: config_lib.Config, log: Log):
  """The model at model.path with its tokenizer, set up per cfg.model."""
  if cfg.model.tokenizer in ('char', 'byte'):
    raise errors.ConfigError(
        f'model.tokenizer={cfg.model.tokenizer!r} does not fit the pretrained '
        f'model.path={cfg.model.path!r}; use \'auto\' (its own tokenizer)')
  t0 = time.perf_counter()
  model = pretrained.load(cfg.model.path, dtype=cfg.model.dtype,
                          param_dtype=cfg.model.param_dtype)
  try:
    tokenizer = model.tokenizer.with_prompts(
        chat=cfg.model.chat_template, system=cfg.model.system_prompt)
  except ValueError as e:
    raise errors.ConfigError(str(e)) from None
  log(f'loaded {model.source}: {model.cfg.num_layers} layers, '
      f'{model_config.param_count(model.cfg) / 1e6:.1f}M params, vocab '
      f'{model.cfg.vocab_size}, in {time.perf_counter() - t0:.1f}s')
  return dataclasses.replace(model, tokenizer=tokenizer)


def enter_mesh(
    cfg: config_lib.Config, log: Log, resources: contextlib.ExitStack
) -> None:
  """Builds cfg.mesh over every device and activates it for the run.

  One device gets a 1-device mesh: the same code path, at no measurable
  cost.
  """
  devices = jax.devices()
  shape = config_lib.mesh_shape(cfg, len(devices))
  resources.enter_context(sharding.use_mesh(
      sharding.make_mesh(*shape, devices=devices),
      sharding.merge_rules(cfg.mesh.rules)))
  if len(devices) > 1:
    log(f'mesh: data={shape[0]} fsdp={shape[1]} tensor={shape[2]} over '
        f'{len(devices)} {devices[0].platform} devices')


def _size(n: float) -> str:
  for unit in ('B', 'KiB', 'MiB', 'GiB'):
    if n < 1024 or unit == 'GiB':
      return f'{n:.1f} {unit}' if unit != 'B' else f'{int(n)} B'
    n /= 1024
  raise AssertionError('unreachable')


def check_memory(
    cfg: config_lib.Config,
    step_fn: Callable,
    state: train_state_lib.TrainState,
    batch: TrainBatch,
    log: Log,
) -> None:
  """Compiles the train step, logs its memory per device, checks the limit.

  Raises:
    ConfigError: it needs more than mesh.memory_limit_gib (or the device's
      own limit), with what to change.
  """
  # Typed as the loop's keys are (uncommitted), so that the loop's first
  # call finds this executable in jax's cache instead of compiling again.
  rng = jax.eval_shape(jax.random.key, 0)
  use = train_step_lib.memory_use(step_fn, state, batch, rng)
  if use is None:
    log('train step memory: not reported by this backend; not checked')
    return
  gib = cfg.mesh.memory_limit_gib
  limit = gib * 2**30 if gib else sharding.device_memory_limit()
  log(f'train step memory per device: arguments {_size(use.argument)}, '
      f'outputs {_size(use.output)} ({_size(use.alias)} in donated inputs), '
      f'temp {_size(use.temp)}, total {_size(use.total)}'
      + (f' of {_size(limit)}' if limit else ' (no device limit known)'))
  if limit and use.total > limit:
    where = f'mesh.memory_limit_gib={gib}' if gib else "the device's limit"
    ro, rl = cfg.rollout, cfg.rl
    raise errors.ConfigError(
        f'the train step needs {_size(use.total)} per device (arguments '
        f'{_size(use.argument)}, temp {_size(use.temp)}), more than '
        f'{_size(limit)} ({where}); shard params and optimizer state over '
        f'more devices (mesh.fsdp={cfg.mesh.fsdp}), recompute activations '
        f"(model.remat={cfg.model.remat!r}: 'dots' or 'full'), store params "
        f"in bfloat16 (model.param_dtype={cfg.model.param_dtype!r}), or "
        f'train on fewer completions at once (lower rollout.batch_size='
        f'{ro.batch_size}, or raise rl.num_minibatches={rl.num_minibatches})')


def _verifier_name(value) -> str:
  """A short name of a verifier config value, for log lines."""
  if isinstance(value, str):
    return value
  if isinstance(value, dict):
    if 'parts' in value:
      return '+'.join(_verifier_name(p) for p in value['parts'])
    return str(value.get('name', '?'))
  if isinstance(value, (list, tuple)):
    return '+'.join(_verifier_name(p) for p in value)
  return str(value)
