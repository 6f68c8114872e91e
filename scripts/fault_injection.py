r"""Kills training runs at random moments and checks that every resume is exact.

A reference run trains for --steps steps uninterrupted. A second run in
another workdir is killed with SIGKILL at --kills random moments (after
training has started, so kills land in steps, in checkpoint saves, and in
between; checkpoints are written every step so many kills hit a save), and
restarted with the same command each time until it finishes. After every
--damage_every-th kill the latest checkpoint is also damaged, in turn:
bytes of an array file flipped in place, an array's value rewritten (both
readable: the checkpoint's checksums catch them), an array file truncated,
array files deleted, the `meta` or `data` item removed, a metadata file cut
short, the folder emptied; the restart must set
it aside and resume from the newest intact checkpoint. It passes when the
killed run ends with bitwise the same params and optimizer state as the
reference, its metrics.jsonl has every step exactly once with the same
values (timings aside), and every damaged checkpoint was set aside with the
restart resuming from the one before it.

--signal SIGTERM or SIGINT stops the run instead of killing it (a
preemption, a Ctrl-C, in steps, in saves, at the last step): each stop must
end it cleanly, with status 0, and the resumed run must match all the same.
A list (`--signal SIGKILL,SIGINT`) sends them in turn, kill by kill.

  python scripts/fault_injection.py --kills 20 --steps 12
  python scripts/fault_injection.py --collect streaming --kills 8 --steps 12

--collect picks how steps collect their groups (COLLECT holds the settings):
`rounds`, the demo's one round per step, or `streaming`, streaming dynamic
sampling (docs/sampler.md#streaming) over 6 continuous-engine slots, so
that steps also carry surplus groups and discard groups still decoding when
the batch fills. Both start with a short warm start, so that steps update
the params; a reference run that never updated fails the check. --set KEY=VALUE (config
keys, repeatable) adds any other override, e.g. `--set rl.beta=0.04`. The
result also reports the reference run's updates and discarded groups, so a
check that exercised nothing shows. Measured figures: BENCHMARKS.md.
"""

import argparse
import functools
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np
import tensorstore as ts

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from jaxgrpo import checkpoint  # pylint: disable=g-import-not-at-top
from jaxgrpo.reporting import metrics as metrics_lib


# Config overrides for each --collect mode, on top of those in `command`.
# A 60-step warm start to a sampled pass rate of 0.5: groups are mixed, so
# steps update the params (an untrained model scores 0 on every group and
# would leave them put, checking nothing but the sampler state).
WARM_START = ('warmstart.enabled=True', 'warmstart.max_steps=200',
              'warmstart.target_pass_rate=0.5', 'warmstart.check_examples=32')
COLLECT = {
    # The demo's rounds, one per step.
    'rounds': ('rollout.max_rounds=1', *WARM_START),
    # Streaming dynamic sampling over 6 continuous-engine slots (a group of
    # G=4 admitted in part waits for a slot, so steps end with groups still
    # decoding, discarded), a budget of 4 rounds' worth of prompts; surplus
    # groups are carried.
    'streaming': ('rollout.engine=continuous', 'rollout.collect=streaming',
                  'rollout.slots=6', 'rollout.max_rounds=4', *WARM_START),
}


def command(workdir: str, steps: int, collect: str = 'rounds',
            overrides: tuple[str, ...] = ()) -> list[str]:
  """The training command: the demo's runlocal shape, `collect`'s settings,
  then `overrides` (KEY=VALUE, config keys without `config.`)."""
  return [
      sys.executable, '-m', 'jaxgrpo.main',
      '--config=configs/demo.py:runlocal', f'--workdir={workdir}',
      f'--config.total_steps={steps}', '--config.warmstart.enabled=False',
      '--config.checkpoint.every=1', '--config.checkpoint.max_to_keep=2',
      '--config.eval.every=0',
      *(f'--config.{kv}' for kv in (*COLLECT[collect], *overrides)),
  ]


def truncate_array(folder: str) -> None:
  """Cuts the largest state array file of the checkpoint `folder` to half
  its size: tensorstore fails to read it."""
  files = glob.glob(os.path.join(folder, 'state', 'ocdbt.process_0', 'd', '*'))
  largest = max(files, key=os.path.getsize)
  os.truncate(largest, os.path.getsize(largest) // 2)


def flip_bytes(folder: str) -> None:
  """Flips 8 bytes in the middle of the largest state array file of the
  checkpoint `folder`, in place (the file keeps its size). Where they fall
  in a zstd block's literals the array decodes to other values with no
  error, which only the checksums catch (most often, on these
  checkpoints); elsewhere tensorstore fails to read it."""
  files = glob.glob(os.path.join(folder, 'state', 'ocdbt.process_0', 'd', '*'))
  largest = max(files, key=os.path.getsize)
  with open(largest, 'r+b') as f:
    data = bytearray(f.read())
    for i in range(len(data) // 2, len(data) // 2 + 64, 8):
      data[i] ^= 0x5A
    f.seek(0)
    f.write(data)


def rewrite_value(folder: str, path: str = 'params/embedding/value') -> None:
  """Rewrites one bit of the state's array at `path` in the checkpoint
  `folder` through tensorstore: the checkpoint reads, with another value."""
  array = ts.open({'driver': 'zarr', 'path': path.replace('/', '.'),
                   'kvstore': {'driver': 'ocdbt', 'base': 'file://'
                               + os.path.join(folder, 'state') + '/'}},
                  open=True).result()
  value = array.read().result()
  value.reshape(-1).view(np.uint8)[5] ^= 0x10
  array.write(value).result()


def _delete_arrays(folder: str) -> None:
  for path in glob.glob(os.path.join(folder, '*', 'ocdbt.process_0', 'd', '*')):
    os.remove(path)


def _cut_json(folder: str) -> None:
  with open(os.path.join(folder, 'state', '_METADATA'), 'w') as f:
    f.write('{"tree_metadata": ')


def _empty(folder: str) -> None:
  shutil.rmtree(folder)
  os.mkdir(folder)


DAMAGES = {
    'array bytes flipped in place': flip_bytes,
    'array value rewritten': rewrite_value,
    'truncated array file': truncate_array,
    'array files deleted': _delete_arrays,
    'meta item removed': lambda f: shutil.rmtree(os.path.join(f, 'meta')),
    'metadata JSON cut short': _cut_json,
    'data item removed': lambda f: shutil.rmtree(os.path.join(f, 'data')),
    'folder emptied': _empty,
}


def _steps(workdir: str) -> list[int]:
  """The complete checkpoints' steps, newest first."""
  try:
    names = os.listdir(os.path.join(workdir, 'checkpoints'))
  except FileNotFoundError:
    return []
  return sorted((int(n) for n in names if n.isdigit()), reverse=True)


def _has_checkpoint(workdir: str) -> bool:
  """Whether a complete checkpoint exists (orbax names them by step)."""
  try:
    return any(name.isdigit()
               for name in os.listdir(os.path.join(workdir, 'checkpoints')))
  except FileNotFoundError:
    return False


def _lines(path: str) -> int:
  try:
    with open(path) as f:
      return sum(1 for _ in f)
  except FileNotFoundError:
    return 0


def run_with_kills(workdir: str, argv: list[str], kills: int,
                   rng: random.Random, damage_every: int = 2,
                   signals: tuple[signal.Signals, ...] = (signal.SIGKILL,)
                   ) -> dict:
  """Runs `argv` (training in `workdir`) to completion, SIGKILLing `kills`
  times and damaging the latest checkpoint after every `damage_every`-th
  kill. `signals` are sent in turn, kill by kill: SIGTERM or SIGINT stops
  the run instead (a preemption, a Ctrl-C): each stop must end the run
  cleanly (status 0); one that comes at its last step leaves it complete,
  and counts as no kill.

  Returns:
    kills, starts, restorable (kills after which the latest checkpoint
    restored), damaged (what was damaged, and where the restart resumed),
    problems (restarts that did not set the damage aside or resumed from
    another step than the newest intact one).
  """
  done_kills, starts, restorable = 0, 0, 0
  damaged, problems = [], []
  expect = None  # (damaged step, step the next start must resume from)
  kinds = list(DAMAGES)
  metrics_path = os.path.join(workdir, 'metrics.jsonl')
  log_path = workdir + '.log'
  while True:
    starts += 1
    with open(log_path, 'w') as log:
      proc = subprocess.Popen(argv, cwd=REPO, stdout=log,
                              stderr=subprocess.PIPE, text=True,
                              env={**os.environ, 'PYTHONUNBUFFERED': '1'})
      killed = False
      sig = signals[done_kills % len(signals)]
      if done_kills < kills:
        # Wait until a checkpoint exists and this start has trained at
        # least one step, then kill at a random moment within the next few.
        before = _lines(metrics_path)
        deadline = time.time() + 300
        while ((_lines(metrics_path) <= before or not _has_checkpoint(workdir))
               and proc.poll() is None and time.time() < deadline):
          time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 1.5))
        if proc.poll() is None:
          proc.send_signal(sig)
          proc.wait()
          killed = True
      _, err = proc.communicate()
    with open(log_path) as f:
      out = f.read()
    if killed and sig != signal.SIGKILL:
      if proc.returncode != 0:
        problems.append(f'start {starts}: {sig.name} ended the run with '
                        f'status {proc.returncode}: {err[-600:]!r}')
      killed = 'stopped' in out  # else it came at the last step: complete
    if expect is not None and (killed and 'resumed from' not in out
                               and 'is damaged' not in out):
      pass  # killed before it resumed: the next start must do it
    elif expect is not None:
      step, resume = expect
      if (f'the checkpoint of step {step} is damaged' not in out
          or f'at step {resume}\n' not in out):
        problems.append(f'start {starts}: step {step} damaged, expected a '
                        f'resume from step {resume}: {out[:600]!r}')
      expect = None
    if not killed:
      if proc.returncode != 0:
        raise RuntimeError(
            f'run failed after {done_kills} kills:\n{err[-3000:]}')
      return {'kills': done_kills, 'starts': starts,
              'restorable': restorable, 'damaged': damaged,
              'problems': problems}
    done_kills += 1
    try:
      checkpoint.load_state_arrays(os.path.join(workdir, 'checkpoints'))
      restorable += 1
    except Exception as e:  # pylint: disable=broad-except
      print(f'kill {done_kills}: latest checkpoint not restorable: {e!r}')
    present = _steps(workdir)
    if (damage_every and done_kills % damage_every == 0 and len(present) > 1
        and expect is None):
      kind = kinds[len(damaged) % len(kinds)]
      DAMAGES[kind](os.path.join(workdir, 'checkpoints', str(present[0])))
      expect = (present[0], present[1])
      damaged.append({'kill': done_kills, 'step': present[0], 'kind': kind,
                      'resume_from': present[1]})


def compare(reference: str, killed: str) -> list[str]:
  """Differences between the two workdirs' final state and metrics."""
  problems = []
  ref_state = checkpoint.load_state_arrays(os.path.join(reference, 'checkpoints'))
  got_state = checkpoint.load_state_arrays(os.path.join(killed, 'checkpoints'))
  ref_leaves = jax.tree_util.tree_leaves_with_path(ref_state)
  got_leaves = dict(jax.tree_util.tree_leaves_with_path(got_state))
  for path, value in ref_leaves:
    other = got_leaves.get(path)
    if other is None or not np.array_equal(value, other):
      problems.append(f'state differs at {jax.tree_util.keystr(path)}')
  ref = metrics_lib.read_metrics(reference)
  got = metrics_lib.read_metrics(killed)
  if [r['step'] for r in got] != [r['step'] for r in ref]:
    problems.append(f'steps in metrics.jsonl: {[r["step"] for r in got]}')
  for a, b in zip(ref, got):
    for key in a:
      if not key.startswith('perf/') and a[key] != b.get(key):
        problems.append(f'step {a["step"]}: {key} {a[key]} != {b.get(key)}')
  return problems


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--kills', type=int, default=20)
  parser.add_argument('--steps', type=int, default=12)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--damage_every', type=int, default=2,
                      help='damage the latest checkpoint after every Nth kill '
                      '(0: never)')
  parser.add_argument('--collect', choices=sorted(COLLECT), default='rounds',
                      help='how steps collect their groups (the settings of '
                      'COLLECT)')
  parser.add_argument('--set', action='append', default=[], metavar='KEY=VALUE',
                      help='another config override, e.g. rl.beta=0.04 '
                      '(repeatable; after those of --collect)')
  parser.add_argument('--signal', default='SIGKILL',
                      help='what each kill sends: SIGTERM or SIGINT stop the '
                      'run cleanly (a preemption, a Ctrl-C), status 0; a '
                      'comma-separated list is sent in turn')
  parser.add_argument('--json', help='also write the result here')
  args = parser.parse_args()
  signals = tuple(args.signal.split(','))
  for name in signals:
    if name not in ('SIGKILL', 'SIGTERM', 'SIGINT'):
      parser.error(f'--signal {args.signal}: {name!r} is not SIGKILL, '
                   'SIGTERM or SIGINT')
  for kv in args.set:
    if '=' not in kv:
      parser.error(f'--set {kv}: expected KEY=VALUE')
  overrides = tuple(kv.removeprefix('config.') for kv in args.set)
  tmp = tempfile.mkdtemp()
  try:
    reference = os.path.join(tmp, 'reference')
    killed = os.path.join(tmp, 'killed')
    t0 = time.time()
    argv = functools.partial(command, steps=args.steps, collect=args.collect,
                             overrides=overrides)
    subprocess.run(argv(reference), cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL)
    got = run_with_kills(killed, argv(killed), args.kills,
                         random.Random(args.seed), args.damage_every,
                         tuple(signal.Signals[name] for name in signals))
    kills, starts, restorable = got['kills'], got['starts'], got['restorable']
    problems = got['problems'] + compare(reference, killed)
    names = os.listdir(os.path.join(killed, 'checkpoints'))
    leftovers = [name for name in names if 'tmp' in name]
    aside = sorted(name for name in names if '.damaged-' in name)
    ref = metrics_lib.read_metrics(reference)
    result = {'collect': args.collect, 'overrides': list(overrides),
              'signal': args.signal,
              'kills': kills, 'starts': starts, 'steps': args.steps,
              # What the reference run did, so a vacuous check shows.
              'updates': sum('train/loss' in r for r in ref),
              'groups_discarded': sum(
                  r.get('rollout/groups_discarded', 0) for r in ref),
              # rollout.in_flight='keep': groups carried part-decoded
              # across a step boundary (and so through checkpoints).
              'partials_kept': sum(
                  r.get('rollout/partial_kept', 0) for r in ref),
              # rollout.in_flight='retry': discarded groups whose examples
              # the sampler held (through checkpoints) for the next step.
              'groups_retried': sum(
                  r.get('rollout/groups_retried', 0) for r in ref),
              'restorable_after_kill': restorable,
              'damaged': got['damaged'], 'set_aside': aside,
              'exact': not problems and restorable == kills,
              'vacuous': not any('train/loss' in r for r in ref),
              'problems': problems[:20], 'tmp_folders_left': leftovers,
              'seconds': round(time.time() - t0, 1)}
    print(json.dumps(result, indent=2))
    print(f'{result["updates"]} of {args.steps} reference steps updated the '
          'params')
    print(f'{kills} kills, {starts} starts, {restorable} of {kills} kills '
          f'left a restorable checkpoint, {len(got["damaged"])} damaged '
          'checkpoints set aside with each restart resuming from the newest '
          'intact one: '
          + ('the resumed run matches the uninterrupted one exactly'
             if not problems else f'{len(problems)} differences'))
    if args.json:
      with open(args.json, 'w') as f:
        json.dump(result, f, indent=2)
    sys.exit(0 if result['exact'] and not result['vacuous'] else 1)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == '__main__':
  main()
