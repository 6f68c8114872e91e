r"""Decode roofline, train-step MFU and bf16 logits on one accelerator.

One script for a short lease of a GPU or TPU (about 5 minutes on an H200),
each part timed on its own and recorded even when another fails:

  1. ceilings: the device-to-device copy bandwidth and the dense bf16
     matmul rate, measured here (8192^3), beside the datasheet's;
  2. bf16 vs f32 logits: a tiny Hugging Face Qwen2 checkpoint (written by
     `--make-tiny` on a machine with torch and transformers, with
     transformers' f32 logits beside it) loaded with `jaxgrpo.model.hf` in
     f32 and in bf16; max and mean absolute logit difference, top-1
     agreement and the mean KL(f32 || bf16) per token;
  3. decode: a random-init model of Qwen2.5-0.5B's shape in bf16, prompts
     of P = 128 tokens, T = 256 new tokens, no stop token, at 64, 128 and
     256 slots (rows decoded at once); the decode loop alone is timed
     (prefill apart) and set against the HBM roofline: every decode step
     must read every weight once and each row's live KV cache, so
     tokens/s <= slots * bandwidth / (weight bytes + live KV bytes);
  4. the GRPO train step (`train_step.make_train_step`, AdamW, clipped
     token-mean loss) of the same model in bf16 on R rows of P + T tokens:
     model FLOPs (6 per parameter per token, plus attention) over time,
     against the bf16 peak.

  python benchmarks/accelerator.py --make-tiny .devcarry/tiny   # here, CPU
  python benchmarks/accelerator.py --tiny .devcarry/tiny --json out.json
  python benchmarks/accelerator.py --tiny .devcarry/tiny --small  # CPU check
  python benchmarks/accelerator.py --summarize-trace decode_trace.json.gz

`--small` shrinks every part to seconds on a CPU (the figures then mean
nothing; it keeps the script working).
"""

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np

from benchmarks import record

_TINY_SIZES = dict(vocab_size=1024, hidden_size=256, intermediate_size=704,
                   num_hidden_layers=4, num_attention_heads=8,
                   num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
                   max_position_embeddings=512, rope_theta=1e6,
                   tie_word_embeddings=True, bos_token_id=1,
                   eos_token_id=None, pad_token_id=0)
# H200 SXM datasheet: 4.8 TB/s HBM3e, 989 TFLOP/s dense bf16.
_PEAKS = {'NVIDIA H200': (4.8e12, 989e12), 'NVIDIA H100 80GB HBM3': (
    3.35e12, 989e12)}


def make_tiny(folder: str) -> None:
  """Writes a tiny random Qwen2 checkpoint and transformers' f32 logits."""
  import torch
  import transformers
  config = transformers.Qwen2Config(**_TINY_SIZES)
  torch.manual_seed(0)
  model = transformers.AutoModelForCausalLM.from_config(
      config, attn_implementation='eager')
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith('norm.weight'):
        p.copy_(1.0 + 0.1 * torch.randn_like(p))
      else:
        p.normal_(0.0, 0.05)
  model.eval().save_pretrained(folder, safe_serialization=True)
  rng = np.random.default_rng(0)
  tokens = rng.integers(2, _TINY_SIZES['vocab_size'], (8, 256)).astype(
      np.int32)
  with torch.no_grad():
    logits = model(input_ids=torch.from_numpy(tokens).long()).logits.numpy()
  np.savez_compressed(os.path.join(folder, 'reference.npz'), tokens=tokens,
                      logits=logits)
  print(f'wrote {folder}: Qwen2 {sum(p.numel() for p in model.parameters()):,}'
        ' params, transformers f32 logits of 8 x 256 tokens')


def _timed(fn, repeats: int) -> list[float]:
  import jax
  out = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    out.append(time.perf_counter() - t0)
  return out


def ceilings(small: bool) -> dict:
  """Copy bandwidth (bytes read + written) and bf16 matmul rate, measured."""
  import jax
  import jax.numpy as jnp
  n = 2**22 if small else 2**31  # bf16 elements: 4 GiB on the device
  x = jnp.ones((n,), jnp.bfloat16)
  copy = jax.jit(lambda a: a * 2)
  jax.block_until_ready(copy(x))
  t = min(_timed(lambda: copy(x), 10))
  m = 512 if small else 8192
  a = jax.random.normal(jax.random.key(0), (m, m), jnp.bfloat16)
  b = jax.random.normal(jax.random.key(1), (m, m), jnp.bfloat16)
  mm = jax.jit(lambda a, b: a @ b)
  jax.block_until_ready(mm(a, b))
  tm = statistics.median(_timed(lambda: mm(a, b), 10))
  return {'copy_bytes_per_s': 2 * n * 2 / t, 'matmul_bf16_flops': 2 * m**3 / tm,
          'matmul_size': m}


def logits_agreement(tiny: str) -> dict:
  """Our f32 and bf16 logits against transformers' f32 on a tiny Qwen2."""
  import jax
  import jax.numpy as jnp
  from jaxgrpo.model import decoder
  from jaxgrpo.model import hf
  ref = np.load(os.path.join(tiny, 'reference.npz'))
  tokens = jnp.asarray(ref['tokens'])
  theirs = ref['logits'].astype(np.float64)
  b, t = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(t), (b, t))
  causal = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))

  def run(dtype, precision=None):
    _, graphdef, params = hf.load(tiny, dtype=dtype, param_dtype=dtype)
    fwd = jax.jit(decoder.forward, static_argnums=0)
    if precision:
      with jax.default_matmul_precision(precision):
        logits, _ = fwd(graphdef, params, tokens, positions, causal)
    else:
      logits, _ = fwd(graphdef, params, tokens, positions, causal)
    return np.asarray(logits, np.float64)

  def compare(ours, against):
    diff = np.abs(ours - against)
    p = _log_softmax(against)
    q = _log_softmax(ours)
    kl = (np.exp(p) * (p - q)).sum(-1)
    return {'max_abs': float(diff.max()), 'mean_abs': float(diff.mean()),
            'logit_std': float(against.std()),
            'top1_agree': float((ours.argmax(-1) == against.argmax(-1)).mean()),
            'kl_mean': float(kl.mean()), 'kl_max': float(kl.max())}

  f32_highest = run('float32', 'highest')
  f32_default = run('float32')
  bf16 = run('bfloat16')
  return {
      'tokens': [b, t],
      'f32_highest_vs_transformers_f32': compare(f32_highest, theirs),
      'f32_default_vs_transformers_f32': compare(f32_default, theirs),
      'bf16_vs_transformers_f32': compare(bf16, theirs),
      'bf16_vs_f32_highest': compare(bf16, f32_highest),
  }


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _model(small: bool):
  import jax
  from jaxgrpo.model import config as model_config
  from jaxgrpo.model import decoder
  name = 'small_10m' if small else 'qwen2.5_0.5b'
  cfg = model_config.preset(name, dtype='bfloat16', param_dtype='bfloat16')
  graphdef, params = decoder.init_params(cfg, jax.random.key(0))
  return name, cfg, graphdef, params


def _weight_bytes_per_step(cfg, params) -> int:
  """Bytes a decode step must read: every weight, the embedding table once
  (the tied lm_head reads it whole; the lookup touches a few rows)."""
  import jax
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))


def decode(cfg, graphdef, params, slots_list, prompt_len: int, new_tokens: int,
           bandwidth: float, repeats: int, forms: list[str],
           on_row=lambda rows: None) -> list[dict]:
  """Decode tokens/s of the static generator, prefill apart, for each
  decode-attention form (`attention.DECODE_ATTENTION`); then greedy at the
  most slots, which leaves the sampling's cost out."""
  import jax
  from jaxgrpo.generate.generator import Generator
  from jaxgrpo.generate.sampling import Sampling
  from jaxgrpo.model import attention
  group = 8
  weight_bytes = _weight_bytes_per_step(cfg, params)
  kv_per_token = (2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim *
                  np.dtype(cfg.dtype).itemsize)
  runs = [(form, 1.0, slots) for form in forms for slots in slots_list]
  runs.append((forms[-1], 0.0, max(slots_list)))
  rows_out = []
  for form, temperature, slots in runs:
    attention.DECODE_ATTENTION = form
    jax.clear_caches()
    gen = Generator(graphdef=graphdef, model_cfg=cfg,
                    sampling=Sampling(temperature=temperature),
                    max_new_tokens=new_tokens, num_samples=group)
    print(f'  [{form}, temperature {temperature}]', end='', flush=True)
    row = _guarded(lambda: _decode_one(  # pylint: disable=cell-var-from-loop
        gen, cfg, params, slots, prompt_len, new_tokens, bandwidth, repeats,
        weight_bytes, kv_per_token), slots=slots)
    rows_out.append({'form': form, 'temperature': temperature, **row})
    on_row(rows_out)
  attention.DECODE_ATTENTION = 'auto'
  jax.clear_caches()
  return rows_out


def _guarded(fn, **ident) -> dict:
  """fn()'s row, or `ident` with the error (one failed size, an
  out-of-memory say, leaves the others measured)."""
  try:
    return fn()
  except Exception as e:  # pylint: disable=broad-except
    traceback.print_exc()
    return {**ident, 'error': f'{type(e).__name__}: {e}'}


def _decode_one(gen, cfg, params, slots, prompt_len, new_tokens, bandwidth,
                repeats, weight_bytes, kv_per_token) -> dict:
  import jax
  group = gen.num_samples
  b = slots // group
  rng = np.random.default_rng(slots)
  tokens = rng.integers(2, cfg.vocab_size, (b, prompt_len)).astype(np.int32)
  mask = np.ones((b, prompt_len), bool)
  times, prefill_times = [], []
  for rep in range(repeats + 1):  # the first compiles
    t0 = time.perf_counter()
    state = gen.prefill(params, tokens, mask, jax.random.key(rep))
    jax.block_until_ready(state)
    t1 = time.perf_counter()
    state = gen.decode(params, state)
    jax.block_until_ready(state)
    t2 = time.perf_counter()
    if rep:
      prefill_times.append(t1 - t0)
      times.append(t2 - t1)
  steps = new_tokens - 1  # the prefill samples the first token
  dt = statistics.median(times)
  tok_s = slots * steps / dt
  # Live context per step: P + t for t = 1..T-1 (mean P + T/2).
  live_kv = slots * (prompt_len + new_tokens / 2) * kv_per_token
  alloc_kv = slots * (prompt_len + new_tokens) * kv_per_token
  roof = slots * bandwidth / (weight_bytes + live_kv)
  roof_alloc = slots * bandwidth / (weight_bytes + alloc_kv)
  row = {'slots': slots, 'decode_s': times, 'prefill_s': prefill_times,
         'ms_per_step': 1e3 * dt / steps, 'tokens_per_s': tok_s,
         'weight_bytes': weight_bytes, 'live_kv_bytes_mean': live_kv,
         'roofline_tokens_per_s': roof, 'fraction_of_roofline': tok_s / roof,
         'roofline_full_cache_tokens_per_s': roof_alloc,
         'fraction_of_full_cache_roofline': tok_s / roof_alloc,
         'achieved_bytes_per_s': (weight_bytes + live_kv) * steps / dt}
  print(f'  decode slots={slots}: {tok_s:,.0f} tok/s, '
        f'{row["ms_per_step"]:.2f} ms/step, {tok_s / roof:.1%} of the '
        f'roofline ({roof:,.0f} tok/s; weights {weight_bytes / 1e9:.2f} GB, '
        f'live KV {live_kv / 1e9:.2f} GB), prefill '
        f'{statistics.median(prefill_times) * 1e3:.0f} ms', flush=True)
  return row


def train_step_flops(cfg, prompts: int, prompt_len: int, rows: int,
                     new_tokens: int) -> float:
  """Model FLOPs of one train step, as `rl.logprobs` computes it.

  Each of the B prompts runs once (its G completions attend to its cache),
  then each of the R = B * G completions; the lm_head only on completion
  positions. 6 FLOPs per matmul weight per token (forward and backward),
  plus attention's QK^T and AV over every (query, key) pair computed (the
  masks do not skip work): P^2 per prompt, T * (P + T) per completion.
  Norms, biases and the softmaxes are left out.
  """
  d, h, hd = cfg.embed_dim, cfg.num_heads, cfg.head_dim
  kv = cfg.num_kv_heads
  block = d * h * hd * 2 + d * kv * hd * 2 + 3 * d * cfg.mlp_dim
  backbone = cfg.num_layers * block
  tokens = prompts * prompt_len + rows * new_tokens
  head = cfg.vocab_size * d * rows * new_tokens
  pairs = prompts * prompt_len**2 + rows * new_tokens * (prompt_len +
                                                          new_tokens)
  attention = 2 * 2 * cfg.num_layers * h * hd * pairs
  return 6 * (backbone * tokens + head) + 3 * attention


def train_step_mfu(cfg, graphdef, params, rows_list, prompt_len: int,
                   new_tokens: int, peak: float, repeats: int,
                   remats: list[str], cotangents: list[str],
                   forms: list[str], on_row=lambda rows: None) -> list[dict]:
  """GRPO train step time and model-FLOP utilisation for each attention
  form of its passes (`attention.MULTI_TOKEN_ATTENTION`), remat policy and
  dtype of the logits' cotangent (`decoder.LOGITS_COTANGENT`), in that
  nesting, each at every row count; `on_row(rows so far)` after each."""
  import jax
  from jaxgrpo.model import attention
  from jaxgrpo.model import decoder
  optimizer = _optimizer()
  out = []
  for form in forms:
    for remat in remats:
      for cotangent in cotangents:
        attention.MULTI_TOKEN_ATTENTION = form
        decoder.LOGITS_COTANGENT = cotangent
        jax.clear_caches()
        for rows in rows_list:
          print(f'  [attention {form}, logits cotangent {cotangent}]',
                end='', flush=True)
          row = _guarded(lambda: _train_one(  # pylint: disable=cell-var-from-loop
              cfg, graphdef, params, optimizer, rows, prompt_len, new_tokens,
              peak, repeats, remat), rows=rows, remat=remat)
          out.append({'attention': form, 'logits_cotangent': cotangent,
                      **row})
          on_row(out)
  attention.MULTI_TOKEN_ATTENTION = 'einsum'
  decoder.LOGITS_COTANGENT = 'compute'
  jax.clear_caches()
  return out


def _train_one(cfg, graphdef, params, optimizer, rows, prompt_len, new_tokens,
               peak, repeats, remat) -> dict:
  once = _train_fn(cfg, graphdef, params, optimizer, rows, prompt_len,
                   new_tokens, remat)
  compile_s = once()
  times = [once() for _ in range(repeats)]
  seq = prompt_len + new_tokens
  flops = train_step_flops(cfg, rows // 8, prompt_len, rows, new_tokens)
  dt = statistics.median(times)
  row = {'rows': rows, 'seq_len': seq, 'remat': remat, 'step_s': times,
         'compile_s': compile_s, 'model_flops': flops,
         'flops_per_s': flops / dt, 'mfu': flops / dt / peak,
         # Rows x (P + T): the tokens a trainer without prompt sharing runs.
         'row_tokens_per_s': rows * seq / dt}
  print(f'  train step rows={rows} x {seq} tokens (remat {remat}): '
        f'{dt * 1e3:.0f} ms, {flops / dt / 1e12:.0f} TFLOP/s, MFU '
        f'{row["mfu"]:.1%} (compiled in {compile_s:.0f}s)', flush=True)
  return row


def traces(cfg, graphdef, params, folder: str, prompt_len: int,
           new_tokens: int, slots: int, rows: int) -> dict:
  """Profiler traces (Perfetto JSON) of a short decode and a train step."""
  import glob
  import shutil
  import tempfile
  import jax
  from jaxgrpo.generate.generator import Generator
  from jaxgrpo.generate.sampling import Sampling
  out = {}
  gen = Generator(graphdef=graphdef, model_cfg=cfg, sampling=Sampling(),
                  max_new_tokens=new_tokens, num_samples=8)
  tokens = np.ones((slots // 8, prompt_len), np.int32)
  mask = np.ones_like(tokens, bool)

  def decode_once():
    state = gen.prefill(params, tokens, mask, jax.random.key(0))
    jax.block_until_ready(gen.decode(params, state))

  optimizer = _optimizer()
  for name, prepare in (('decode', lambda: decode_once),
                        ('train', lambda: _train_fn(cfg, graphdef, params,
                                                    optimizer, rows,
                                                    prompt_len, 256))):
    try:
      fn = prepare()
      fn()  # compile
      tmp = tempfile.mkdtemp()
      with jax.profiler.trace(tmp, create_perfetto_trace=True):
        fn()
      found = glob.glob(os.path.join(tmp, '**', 'perfetto_trace.json.gz'),
                        recursive=True)
      dest = os.path.join(folder, f'{name}_trace.json.gz')
      shutil.copy(found[0], dest)
      out[name] = {'file': os.path.basename(dest),
                   'bytes': os.path.getsize(dest)}
      print(f'  trace {name}: {os.path.getsize(dest):,} bytes', flush=True)
    except Exception as e:  # pylint: disable=broad-except
      traceback.print_exc()
      out[name] = {'error': f'{type(e).__name__}: {e}'}
  return out


def _train_fn(cfg, graphdef, params, optimizer, rows, prompt_len, new_tokens,
              remat='none'):
  """A callable running one train step on a fixed batch (a fresh state,
  carried from call to call); each call returns its seconds."""
  import jax
  from jaxgrpo import train_state as train_state_lib
  from jaxgrpo import train_step as train_step_lib
  batch = _train_batch(cfg, rows, prompt_len, new_tokens)
  holder = [train_state_lib.create_train_state(
      graphdef, jax.tree.map(lambda x: x.copy(), params), optimizer,
      keep_reference=False)]
  fn = train_step_lib.make_train_step(
      graphdef=graphdef, optimizer=optimizer,
      loss_cfg=train_step_lib.LossConfig(), remat=remat)
  calls = [0]

  def once() -> float:
    t0 = time.perf_counter()
    holder[0], metrics = fn(holder[0], batch, jax.random.key(calls[0]))
    jax.block_until_ready((holder[0], metrics))
    calls[0] += 1
    return time.perf_counter() - t0
  return once


def _optimizer():
  from jaxgrpo import optimizer as optimizer_lib
  return optimizer_lib.make_optimizer(
      learning_rate=1e-6, warmup_steps=0, total_steps=100, max_grad_norm=1.0)


def _train_batch(cfg, rows, prompt_len, new_tokens):
  from jaxgrpo.typing import TrainBatch
  b = rows // 8
  rng = np.random.default_rng(rows)
  return TrainBatch(
      prompt_tokens=rng.integers(1, cfg.vocab_size, (b, prompt_len)).astype(
          np.int32),
      prompt_mask=np.ones((b, prompt_len), bool),
      completion_tokens=rng.integers(1, cfg.vocab_size,
                                     (rows, new_tokens)).astype(np.int32),
      completion_mask=np.ones((rows, new_tokens), bool),
      old_logps=-rng.uniform(8, 12, (rows, new_tokens)).astype(np.float32),
      advantages=rng.normal(size=rows).astype(np.float32))


def summarize_trace(path: str, top: int = 12) -> dict:
  """Device time per kernel in a Perfetto trace, and how busy the device
  stream was over the traced span."""
  import collections
  import gzip
  with gzip.open(path, 'rt') as f:
    trace = json.load(f)
  events = trace['traceEvents'] if isinstance(trace, dict) else trace
  devices = {e['pid'] for e in events if e.get('ph') == 'M'
             and e.get('name') == 'process_name'
             and '/device:' in e['args']['name']}
  kernels = [e for e in events if e.get('ph') == 'X' and e['pid'] in devices]
  busy = collections.Counter()
  calls = collections.Counter()
  for e in kernels:
    busy[e['name']] += e['dur']
    calls[e['name']] += 1
  start = min(e['ts'] for e in kernels)
  end = max(e['ts'] + e['dur'] for e in kernels)
  total = sum(busy.values())
  out = {'span_ms': (end - start) / 1e3, 'busy_ms': total / 1e3,
         'busy_fraction': total / (end - start),
         'kernels': [{'name': n, 'ms': t / 1e3, 'calls': calls[n],
                      'share': t / total} for n, t in busy.most_common(top)]}
  print(f'{path}: device busy {out["busy_ms"]:.1f} of {out["span_ms"]:.1f} ms '
        f'({out["busy_fraction"]:.0%})')
  for k in out['kernels']:
    print(f'  {k["ms"]:8.2f} ms {k["share"]:6.1%} {k["calls"]:6d}  '
          f'{k["name"][:72]}')
  return out


def _part(result: dict, name: str, fn, save=lambda: None):
  """result[name] = fn(), or its error; then `save()`."""
  t0 = time.perf_counter()
  try:
    result[name] = fn()
  except Exception as e:  # pylint: disable=broad-except
    traceback.print_exc()
    result[name] = {'error': f'{type(e).__name__}: {e}'}
  result.setdefault('part_seconds', {})[name] = time.perf_counter() - t0
  print(f'[{name}] {time.perf_counter() - t0:.0f}s', flush=True)
  save()


def parser() -> argparse.ArgumentParser:
  """The command line (tests read `accelerator_next.sh`'s lines with it)."""
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])  # pylint: disable=redefined-outer-name
  parser.add_argument('--make-tiny', help='write the tiny checkpoint here')
  parser.add_argument('--tiny', help='the tiny checkpoint folder')
  parser.add_argument('--small', action='store_true',
                      help='CPU-sized parts (keeps the script working)')
  parser.add_argument('--slots', default='64,128,256')
  parser.add_argument('--rows', default='64,128')
  parser.add_argument('--remat', default='none',
                      help='remat policies of the train step to time')
  parser.add_argument('--attention', default='einsum',
                      help="attention forms of the train step's passes to "
                      'time (einsum, xla, cudnn)')
  parser.add_argument('--prompt-len', type=int, default=128)
  parser.add_argument('--new-tokens', type=int, default=256)
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--cotangents', default='float32,compute',
                      help='logits-cotangent dtypes of the train step to time')
  parser.add_argument('--forms', default='broadcast,einsum',
                      help='decode-attention forms to time')
  parser.add_argument('--decode-live-buckets', default='auto',
                      help='attention.DECODE_LIVE_BUCKETS for the decode '
                      "part: auto (off on accelerators), or 8 to read only "
                      'the live part of the cache')
  parser.add_argument('--parts', default='ceilings,logits,decode,train')
  parser.add_argument('--trace-to', help='write profiler traces here')
  parser.add_argument('--summarize-trace', nargs='+', metavar='TRACE',
                      help='print the kernel time of these traces and stop')
  parser.add_argument('--json', help='also write the results here')
  return parser


def main(argv=None) -> int:
  args = parser().parse_args(argv)
  if args.make_tiny:
    make_tiny(args.make_tiny)
    return 0
  if args.summarize_trace:
    for path in args.summarize_trace:
      summarize_trace(path)
    return 0
  import jax
  from jaxgrpo.model import attention
  if args.decode_live_buckets != 'auto':
    attention.DECODE_LIVE_BUCKETS = int(args.decode_live_buckets)
  device = jax.devices()[0]
  kind = getattr(device, 'device_kind', str(device))
  bandwidth, peak = _PEAKS.get(kind, (None, None))
  result = {
      'command': ' '.join(['python'] + sys.argv),
      'commit': record.commit(),
      'machine': {'platform': platform.platform(), 'device': kind,
                  'devices': jax.device_count(), 'jax': jax.__version__,
                  'backend': jax.default_backend(),
                  'xla_flags': os.environ.get('XLA_FLAGS', '')},
      'datasheet': {'hbm_bytes_per_s': bandwidth, 'bf16_flops': peak},
      'args': vars(args),
  }
  print(f'{kind} x{jax.device_count()}, jax {jax.__version__}', flush=True)

  def save(**partial) -> None:
    """Writes what is measured so far (a run stopped at its time limit
    keeps it); `partial`: a part's rows while it runs."""
    if args.json:
      record.write_json(args.json, {**result, **partial})

  parts = args.parts.split(',')
  if 'ceilings' in parts:
    _part(result, 'ceilings', lambda: ceilings(args.small), save)
    print(f'  measured: copy {result["ceilings"].get("copy_bytes_per_s", 0) / 1e12:.2f} '
          f'TB/s, bf16 matmul '
          f'{result["ceilings"].get("matmul_bf16_flops", 0) / 1e12:.0f} '
          f'TFLOP/s', flush=True)
  measured = result.get('ceilings', {})
  bandwidth = bandwidth or measured.get('copy_bytes_per_s') or 1e11
  peak = peak or measured.get('matmul_bf16_flops') or 1e12
  if 'logits' in parts and args.tiny:
    _part(result, 'logits', lambda: logits_agreement(args.tiny), save)
    for k, v in result['logits'].items():
      if isinstance(v, dict):
        print(f'  {k}: {json.dumps(v)}', flush=True)
  if 'decode' in parts or 'train' in parts:
    name, cfg, graphdef, params = _model(args.small)
    from jaxgrpo.model import config as model_config
    result['model'] = {'preset': name,
                       'params': model_config.param_count(cfg),
                       'dtype': cfg.dtype}
    print(f'{name}: {model_config.param_count(cfg):,} params, bf16',
          flush=True)
    p, t = args.prompt_len, args.new_tokens
    if args.small:
      p, t = 16, 16
    if 'decode' in parts:
      slots = [int(s) for s in args.slots.split(',')]
      _part(result, 'decode', functools.partial(
          decode, cfg, graphdef, params, slots, p, t, bandwidth,
          args.repeats, args.forms.split(','),
          lambda rows: save(decode=rows)), save)
    if 'train' in parts:
      rows = [int(r) for r in args.rows.split(',')]
      _part(result, 'train', functools.partial(
          train_step_mfu, cfg, graphdef, params, rows, p, t, peak,
          args.repeats, args.remat.split(','), args.cotangents.split(','),
          args.attention.split(','), lambda rows: save(train=rows)), save)
    if args.trace_to:
      os.makedirs(args.trace_to, exist_ok=True)
      _part(result, 'traces', functools.partial(
          traces, cfg, graphdef, params, args.trace_to, p, 32,
          max(int(s) for s in args.slots.split(',')),
          min(int(r) for r in args.rows.split(','))), save)
  save()
  return 0


if __name__ == '__main__':
  sys.exit(main())
