r"""Opening a large verl-layout Parquet prompt file: time and memory.

Writes N rows (default 1,000,000) in the layout of verl's GSM8K
preprocessing (chat-message `prompt`, `reward_model.ground_truth`,
`data_source`, `extra_info`), then in one process, each in a fresh child
process so that memory figures do not mix:

  * jaxgrpo: `sources.make_dataset('parquet', ...)`, the first batch of 16
    Examples read at random positions (as the sampler draws them);
  * baseline: `pyarrow.parquet.read_table` of the whole file and the same 16
    rows converted, which is what loading the file at once costs.

Prints wall time (imports excluded) and the resident memory each adds, and
the ratios.

  python benchmarks/parquet_open.py --rows 1000000 \
      --json benchmarks/results/parquet_open.json
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_BATCH = 16


def write(path: str, rows: int) -> None:
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  chunk = 100_000
  schema = None
  writer = None
  suffix = (" Let's think step by step and output the final answer after "
            '"####".')
  for start in range(0, rows, chunk):
    n = min(chunk, rows - start)
    table = pa.Table.from_pylist([{
        'data_source': 'openai/gsm8k',
        'prompt': [{'role': 'user',
                    'content': f'Natalia sold {i} clips in April.' + suffix}],
        'ability': 'math',
        'reward_model': {'style': 'rule', 'ground_truth': str(i)},
        'extra_info': {'split': 'train', 'index': i},
    } for i in range(start, start + n)], schema=schema)
    if writer is None:
      schema = table.schema
      writer = pq.ParquetWriter(path, schema)
    writer.write_table(table, row_group_size=10_000)
  writer.close()


def _rss_mb() -> float:
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith('VmRSS:'):
        return int(line.split()[1]) / 1024
  return float('nan')


def child(mode: str, path: str, rows: int) -> dict:
  """Times one way of reaching the first batch; imports are not timed."""
  # pylint: disable=g-import-not-at-top
  import numpy as np
  import pyarrow.parquet as pq
  from jaxgrpo.data import formats
  from jaxgrpo.data import sources
  # pylint: enable=g-import-not-at-top
  positions = np.random.default_rng(0).choice(rows, _BATCH, replace=False)
  before = _rss_mb()
  start = time.perf_counter()
  if mode == 'jaxgrpo':
    ds = sources.make_dataset('parquet', name='gsm8k', path=path,
                              record_format=formats.RecordFields(
                                  prompt='prompt',
                                  answer='reward_model.ground_truth',
                                  id='extra_info.index',
                                  subset='data_source'))
    opened = time.perf_counter() - start
    batch = [ds[int(i)] for i in positions]
    ids = [e.id for e in batch]
  else:
    table = pq.read_table(path)
    opened = time.perf_counter() - start
    batch = [table.slice(int(i), 1).to_pylist()[0] for i in positions]
    ids = [str(r['extra_info']['index']) for r in batch]
  seconds = time.perf_counter() - start
  peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return {'mode': mode, 'open_s': opened, 'first_batch_s': seconds,
          'rss_added_mb': _rss_mb() - before,
          'peak_rss_mb': peak_kb / 1024, 'ids': ids}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rows', type=int, default=1_000_000)
  parser.add_argument('--json', default=None)
  parser.add_argument('--child', nargs=2, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    print(json.dumps(child(args.child[0], args.child[1], args.rows)))
    return
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, 'train.parquet')
    t = time.perf_counter()
    write(path, args.rows)
    size_mb = os.path.getsize(path) / 2**20
    print(f'wrote {args.rows:,} rows ({size_mb:.1f} MB) in '
          f'{time.perf_counter() - t:.1f}s')
    results = {}
    for mode in ('jaxgrpo', 'baseline'):
      out = subprocess.run(
          [sys.executable, __file__, '--rows', str(args.rows), '--child',
           mode, path], check=True, capture_output=True, text=True)
      results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
  ours, base = results['jaxgrpo'], results['baseline']
  assert ours['ids'] == base['ids'], (ours['ids'], base['ids'])
  for r in (ours, base):
    print(f"{r['mode']:9s} open {r['open_s']:.2f}s, first batch of {_BATCH} "
          f"{r['first_batch_s']:.2f}s, memory added {r['rss_added_mb']:.0f} "
          f"MB (peak RSS {r['peak_rss_mb']:.0f} MB, imports included)")
  summary = {
      'rows': args.rows, 'file_mb': size_mb, 'batch': _BATCH,
      'jaxgrpo': ours, 'baseline_read_table': base,
      'first_batch_ratio': base['first_batch_s'] / ours['first_batch_s'],
      'memory_added_ratio': base['rss_added_mb'] / max(
          ours['rss_added_mb'], 1.0),
  }
  print(f"ratio (read_table / jaxgrpo): time to first batch "
        f"{summary['first_batch_ratio']:.2f}x, memory added "
        f"{summary['memory_added_ratio']:.1f}x")
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(summary, f, indent=1)


if __name__ == '__main__':
  main()
