"""Memory and FLOP plan of the study's model, checked by compiling its training step.

  python bench/scale_plan.py            # qwen3_0p6b: full / fixed M=4 / dynamic / v4, T = 4096
                                        # and 32768, one device (no sharding)
  python bench/scale_plan.py --devices 8,64   # the same on meshes of 8 and 64 fake CPU devices
  python bench/scale_plan.py --small    # qwen3_tiny (2 layers) on 8 devices, T=256 (CI test)
  python bench/scale_plan.py --context --devices 8,64 --seq_lens 131072   # rows split over
                                        # devices: context 8 (8 devices), fsdp 8 x context 8 (64)

Attention runs ``attention.implementation = auto`` (on this CPU compiler: full attention by the
blockwise online softmax, the compressed kinds by their XLA path; on a GPU/TPU the Pallas
kernels) and the loss by ``model.loss_token_tile``'s default (tiled when vocab x T >= 2**27).
Each record splits the peak bytes per device into: ``state`` (the step's arguments: parameters,
AdamW moments, the batch), ``activations`` (the remat checkpoints: one B x T x E carry per layer
in model.dtype), ``logits_loss`` (the loss's working set: three B x tile x V float32 tiles plus
the float32 head gradient when tiled, three B x T x V float32 arrays when not) and ``rest``
(peak minus those three: one block's recomputed forward and backward, attention included, and
the compiler's other temporaries). Activations and logits_loss are formulas, not measurements;
the rest is what the compiler's peak leaves after them.

For each case the training step (bf16 compute, float32 parameters and AdamW state, scanned
layers, the remat policy of the case) is lowered with abstract, sharded inputs and compiled
for a data x fsdp x tensor mesh of fake CPU devices; nothing is executed. It records the
parameters, analytic model FLOPs per token (chunkformer/flops.py) against the compiler's
``cost_analysis()``, the compiled peak bytes per device from ``memory_analysis()``, the compile
time, and which accelerators the step fits at which micro-batch. The CPU compiler's buffer
assignment is a PROXY for an accelerator's: XLA:GPU/TPU fuse and schedule differently (and
TPU pads layouts), so treat the fits as estimates with a margin (a case "fits" when its
estimate stays under 90% of the device's memory).

Micro-batch rows per batch shard r: the step is compiled at r = 1; the bytes that do not grow
with r (parameters, optimiser state, gradients) are measured as the step's arguments, the rest
is taken as linear in r, so the largest r that fits is an extrapolation from r = 1 (a larger
global batch then comes from train.grad_accum_steps). The compiler's FLOP count is XLA's HLO
cost analysis of the same step with unscanned layers (the analysis counts a loop body once),
lowered but not compiled; it includes rematerialisation (``full`` recomputes the forward
pass: about 4/3 of the model FLOPs) and counts what the implementation computes (full
attention materialises T x T scores; the blockwise compressed path computes whole blocks).

Each mesh size runs in its own subprocess, since the fake device count is fixed when JAX
starts (XLA_FLAGS=--xla_force_host_platform_device_count).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # as a file, bench/ comes first: bench/kernels.py would shadow kernels

DEVICES_GB = (("TPU v5e", 16), ("H100", 80), ("TPU v5p", 95), ("H200", 141))
MESHES = {1: (1, 1, 1), 8: (1, 4, 2), 64: (2, 16, 2)}  # data, fsdp, tensor
# --context (data, fsdp, context, tensor): each row's tokens split over 8 devices (one host's
# worth of fast links); on 64 devices fsdp 8 over those groups, 8 rows of T per step.
CONTEXT_MESHES = {8: (1, 1, 8, 1), 64: (1, 8, 8, 1)}
FIT_FRACTION = 0.9
# Plan variants beyond configs/lm/qwen3_0p6b.py's: (its variant, dotted field overrides).
PLAN_VARIANTS = {
    # Full attention under context parallelism with K/V passed round a ring, load-balanced
    # (device d holds chunks d and 2n-1-d), instead of GSPMD's all-gather.
    "full_ring": ("full", {"mesh.context_strategy": "ring", "mesh.context_load_balance": True}),
    # The uncompressed tail instead of the local window: raw tokens of the open chunk only.
    "fixed_tail": ("fixed", {"model.attention.window": 0, "model.attention.tail": True}),
    # DeepSeek-V4's layout with the lightning indexer keeping the top 512 entries per query in
    # the CSA layers (HCA layers attend to every entry).
    "v4_indexer": ("v4", {
        "model.layer_pattern": "chunk_size=4,overlap=true,topk=512;chunk_size=128",
        "model.attention.layout": "deepseek_v4", "model.attention.indexer": "lightning",
        "model.attention.query_rank": 512, "model.attention.output_groups": 4,
        "model.attention.output_rank": 512, "model.attention.index_heads": 8,
        "model.attention.index_head_dim": 128}),
}


def base_config(case: dict):
  """The ConfigDict of a case before the plan's mesh, batch and implementation settings:
  config "paper" = configs/paper/runs.py's run ``variant`` at size paper, else qwen3_0p6b's
  (or qwen3_tiny's) ``variant`` (a plan variant: its base variant and overrides)."""
  if case["config"] == "paper":
    from configs.paper import runs
    return runs.get_run_config(case["variant"], "paper")
  from configs.lm import qwen3_0p6b, qwen3_tiny

  module = qwen3_tiny if case["config"] == "qwen3_tiny" else qwen3_0p6b
  variant, overrides = PLAN_VARIANTS.get(case["variant"], (case["variant"], {}))
  c = module.get_config(variant)
  c.update_from_flattened_dict(overrides)
  return c


def cases(small: bool, device_counts, seq_lens, variants, remats, context: bool = False):
  for devices in device_counts:
    for seq_len in seq_lens:
      for variant in variants:
        for remat in remats:
          case = dict(devices=devices, seq_len=seq_len, variant=variant, remat=remat,
                      config="qwen3_tiny" if small else "qwen3_0p6b")
          if context:
            case["context"] = CONTEXT_MESHES[devices][2]
          yield case


def mesh_of(case: dict) -> tuple[int, int, int, int]:
  """(data, fsdp, context, tensor) of a case: MESHES, or CONTEXT_MESHES for a context case."""
  if case.get("context", 1) > 1:
    return CONTEXT_MESHES[case["devices"]]
  data, fsdp, tensor = MESHES[case["devices"]]
  return data, fsdp, 1, tensor


def compile_case(case: dict) -> dict:
  """Compiles one case in this process (its fake devices already set); returns its record."""
  import jax
  import jax.numpy as jnp

  from chunkformer import config as config_lib
  from chunkformer import data as data_lib
  from chunkformer import flops, trainer
  from chunkformer import runtime as runtime_lib
  from chunkformer import train_state as state_lib

  c = base_config(case)
  data, fsdp, context, tensor = mesh_of(case)
  c.mesh.data, c.mesh.fsdp, c.mesh.context, c.mesh.tensor = data, fsdp, context, tensor
  c.model.remat = case["remat"]
  c.model.dtype = "bfloat16"
  # Per platform (here: blockwise full attention, the XLA path of the compressed kinds), or the
  # TPU kernels in interpret mode: a proxy for the kernels' buffers (block tiles, never the
  # T x C entry scores the compressed kinds' XLA path holds).
  kernel_proxy = case.get("implementation") == "pallas_tpu_interpret"
  # Context parallelism runs the XLA paths (GSPMD splits them; a Pallas call it cannot).
  c.model.attention.implementation = ("pallas_tpu" if kernel_proxy
                                      else "xla" if context > 1 else "auto")
  c.model.attention.interpret = kernel_proxy
  c.data.seq_len = case["seq_len"]
  c.data.batch_size = data * fsdp  # one row per batch shard
  c.train.grad_accum_steps = 1
  if case["config"] == "qwen3_tiny":
    c.model.num_layers = 2  # --small: the CI check, kept to seconds
  c.update_from_flattened_dict(case.get("overrides", {}))  # dotted config fields, last (tests)
  config = config_lib.from_dict(c.to_dict())
  rt = runtime_lib.build(config)
  # The batch's keys and dtypes, from a short row (only the data section: a model check such
  # as top-k against the row's entries would refuse a 64-token row).
  probe = data_lib.make_batch(dataclasses.replace(config.data, seq_len=64, batch_size=1),
                              seed=0, step=0, split="train")
  batch = {k: jax.ShapeDtypeStruct((config.data.batch_size, config.data.seq_len), v.dtype,
                                   sharding=rt.batch_sharding) for k, v in probe.items()}
  step = trainer.make_train_step(rt)
  began = time.perf_counter()
  with rt.context():
    compiled = step.lower(rt.abstract_state, batch).compile()
  compile_s = time.perf_counter() - began
  mem = compiled.memory_analysis()
  cost = {}
  if case.get("compiler_flops", True):
    # XLA's cost analysis counts a loop body once, so the FLOPs come from the unscanned step's
    # HLO (global, before partitioning; lowered only, never compiled). The blockwise attention
    # and the tiled loss are loops too: where they run, the count is a lower bound.
    unscanned = dataclasses.replace(config, model=dataclasses.replace(config.model,
                                                                      scan_layers=False))
    rt_unscanned = runtime_lib.build(unscanned)
    with rt_unscanned.context():
      cost = trainer.make_train_step(rt_unscanned).lower(rt_unscanned.abstract_state,
                                                         batch).cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  tokens = config.data.batch_size * config.data.seq_len
  args = int(mem.argument_size_in_bytes)
  peak = int(mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
             + mem.temp_size_in_bytes)
  params = state_lib.param_count(rt.abstract_state.params)
  del jnp
  parts = byte_parts(config, case["seq_len"] // context,
                     rows=config.data.batch_size // (data * fsdp), tensor=tensor,
                     argument_bytes=args, peak_bytes=peak)
  mesh = dict(data=data, fsdp=fsdp, tensor=tensor, **({"context": context} if context > 1 else {}))
  return dict(case, mesh=mesh, params=params, parts=parts,
              rows_per_shard=1, global_rows=config.data.batch_size,
              analytic_flops_per_token=flops.train_flops_per_token(config.model,
                                                                   config.data.seq_len),
              compiler_flops_per_token=float(cost.get("flops", float("nan"))) / tokens,
              argument_bytes=args, temp_bytes=int(mem.temp_size_in_bytes),
              peak_bytes=peak, compile_s=compile_s)


def byte_parts(config, seq_len: int, rows: int, tensor: int, argument_bytes: int,
               peak_bytes: int) -> dict[str, int]:
  """The peak per device split as the module docstring says (formulas + the measured rest);
  ``seq_len``: the tokens of a row one device holds (T / mesh.context)."""
  from chunkformer import loss_tiles

  m = config.model
  act_bytes = 2 if m.dtype == "bfloat16" else 4
  activations = m.num_layers * rows * seq_len * m.d_model * act_bytes if m.remat != "none" else 0
  tile = loss_tiles.token_tile(m.loss_token_tile, m.vocab_size, seq_len)
  vocab = m.vocab_size // tensor  # the vocabulary axis shards over tensor
  if tile:
    logits_loss = 3 * rows * tile * vocab * 4 + vocab * m.d_model * 4
  else:
    logits_loss = 3 * rows * seq_len * vocab * 4
  rest = peak_bytes - argument_bytes - activations - logits_loss
  return dict(state=argument_bytes, activations=activations, logits_loss=logits_loss,
              rest=rest, loss_token_tile=tile)


def fits(record: dict) -> dict[str, int]:
  """Largest micro-batch rows per batch shard that fit each device (0: not even 1)."""
  fixed = record["argument_bytes"]
  per_row = max(record["peak_bytes"] - fixed, 1)
  out = {}
  for name, gb in DEVICES_GB:
    budget = FIT_FRACTION * gb * 1e9
    out[name] = max(int((budget - fixed) // per_row), 0)
  return out


def worker(args) -> None:
  todo = [json.loads(line) for line in open(args.cases)]
  with open(args.output, "a") as out:
    for case in todo:
      try:
        record = compile_case(case)
      except Exception as e:  # a case that does not compile is a result too
        record = dict(case, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
      print(json.dumps(record), file=out, flush=True)
      print(json.dumps({k: v for k, v in record.items() if k != "mesh"}), flush=True)


def attention_name(record: dict) -> str:
  if record.get("implementation") == "pallas_tpu_interpret":
    return f"{record['variant']} (TPU kernels, interpret)"
  if record.get("context", 1) > 1:
    return f"{record['variant']} (XLA path, context {record['context']})"
  return record["variant"]


def mesh_name(record: dict) -> str:
  data, fsdp, context, tensor = mesh_of(record)
  return "x".join(map(str, (data, fsdp, tensor))) + (f", context {context}" if context > 1 else "")


def gib(x: float) -> str:
  return f"{x / 2**30:.2f}"


def write_report(records: list[dict], out_base: str, meta: dict) -> None:
  with open(out_base + ".json", "w") as f:
    json.dump(dict(meta, records=records), f, indent=2)
  lines = [
      "# Scale plan: the training step compiled for fake CPU meshes",
      "",
      f"Command: `{meta['command']}`  ",
      f"Date: {meta['date']}, commit {meta['commit']}, load average at start / end: "
      f"{meta['load_start']} / {meta.get('load_end', '?')} (2 shared CPU cores).",
      "",
      "**CPU-compiled memory is a proxy**: the peak bytes per device below are XLA:CPU's buffer "
      "assignment for the SPMD-partitioned step, not an accelerator's (XLA:GPU/TPU fuse, "
      "schedule and pad differently). Fits are estimates at 90% of device memory; the largest "
      "micro-batch is extrapolated linearly from one row per batch shard. Compiler FLOPs "
      "include rematerialisation and count what the implementation computes, a loop body once "
      "(blockwise attention and the tiled loss are loops: a lower bound there); analytic FLOPs "
      "are model FLOPs (causal, window + visible entries).",
      "",
      "| model | attention | T | devices (d x f x t) | remat | params | analytic GFLOP/token | "
      "compiler GFLOP/token | state GiB/dev | peak GiB/dev (1 row/shard) | compile s | "
      "max rows/shard: " + ", ".join(f"{n} {gb} GB" for n, gb in DEVICES_GB) + " |",
      "|" + "---|" * 12,
  ]
  parts = []
  for r in records:
    mesh = mesh_name(r)
    if "parts" in r:
      p = r["parts"]
      tile = f"tiles of {p['loss_token_tile']}" if p["loss_token_tile"] else "untiled"
      parts.append(f"| {attention_name(r)} | {r['seq_len']} | {r['devices']} | {gib(p['state'])} | "
                   f"{gib(p['activations'])} | {gib(p['logits_loss'])} ({tile}) | "
                   f"{gib(p['rest'])} | {gib(r['peak_bytes'])} |")
    head = (f"| {r['config']} | {attention_name(r)} | {r['seq_len']} | {r['devices']} ({mesh}) "
            f"| {r['remat']} |")
    if "error" in r:
      lines.append(head + f" compile failed: {r['error']} |" + " |" * 6)
      continue
    fit = fits(r)
    compiler = r["compiler_flops_per_token"] / 1e9  # NaN: not counted (--no_compiler_flops)
    lines.append(
        head + f" {r['params'] / 1e6:.1f}M | {r['analytic_flops_per_token'] / 1e9:.3f} | "
        f"{'-' if compiler != compiler else f'{compiler:.3f}'} | {gib(r['argument_bytes'])} | "
        f"{gib(r['peak_bytes'])} | {r['compile_s']:.1f} | "
        + ", ".join(str(fit[n]) for n, _ in DEVICES_GB) + " |")
  lines += ["", "0 rows/shard: one row per batch shard does not fit that device; "
            "with rows r the global batch is r x data x fsdp rows (x grad_accum_steps)."]
  if parts:
    lines += ["", "## Where the bytes go (GiB per device, one row per batch shard)", "",
              "state = parameters + AdamW moments + batch (measured arguments); activations = "
              "remat checkpoints, L x T x E x bytes(model.dtype); logits/loss = the loss's "
              "working set (formula, module docstring); rest = peak - the three: one block's "
              "recomputed forward + backward (attention included) and compiler temporaries.",
              "", "| attention | T | devices | state | activations | logits/loss | rest | peak |",
              "|---|---|---|---|---|---|---|---|", *parts]
  if meta.get("notes"):
    lines += ["", *meta["notes"]]
  with open(out_base + ".md", "w") as f:
    f.write("\n".join(lines) + "\n")


def load() -> str:
  return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--small", action="store_true", help="qwen3_tiny, 8 devices, T=256")
  p.add_argument("--devices", default="1")
  p.add_argument("--seq_lens", default="4096,32768")
  p.add_argument("--variants", default="full,fixed,dynamic,v4")
  p.add_argument("--remats", default="full")
  p.add_argument("--out", default="bench/results/scale_plan")
  p.add_argument("--resume", action="store_true", help="keep the compiled cases of --out")
  p.add_argument("--kernel_proxy", action="store_true",
                 help="attention through the TPU kernels in interpret mode (their buffers)")
  p.add_argument("--context", action="store_true",
                 help="split each row over mesh.context (CONTEXT_MESHES; devices 8 and 64)")
  p.add_argument("--no_compiler_flops", action="store_true",
                 help="skip the unscanned lowering for XLA's FLOP count (minutes per case)")
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--cases", help=argparse.SUPPRESS)
  p.add_argument("--output", help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.worker:
    worker(args)
    return
  if args.small:
    args.devices, args.seq_lens = "8", "256"
  device_counts = [int(x) for x in args.devices.split(",")]
  todo = list(cases(args.small, device_counts, [int(x) for x in args.seq_lens.split(",")],
                    args.variants.split(","), args.remats.split(","), args.context))
  for case in todo:
    case["compiler_flops"] = not args.no_compiler_flops
    if args.kernel_proxy:
      case["implementation"] = "pallas_tpu_interpret"
  records: list[dict] = []
  if args.resume and os.path.exists(args.out + ".json"):  # keep the cases that compiled
    records = [r for r in json.load(open(args.out + ".json"))["records"] if "error" not in r]
    def ident(r):
      return (r["devices"], r["seq_len"], r["variant"], r["remat"], r["config"],
              r.get("implementation", "auto"), r.get("context", 1))
    done = [ident(r) for r in records]
    todo = [c for c in todo if ident(c) not in done]
  from chunkformer import provenance  # light: no jax in this parent process
  commit = provenance.commit()
  meta = dict(command="python bench/scale_plan.py " + " ".join(sys.argv[1:]),
              date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
              commit=commit, load_start=load())
  os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
  with tempfile.TemporaryDirectory() as tmp:
    for devices in device_counts:
      mine = [c for c in todo if c["devices"] == devices]
      case_file, out_file = os.path.join(tmp, f"cases{devices}"), os.path.join(tmp, f"out{devices}")
      with open(case_file, "w") as f:
        f.writelines(json.dumps(c) + "\n" for c in mine)
      env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
                 JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
      # As a module from the repository root: run as a script, bench/ would come first on
      # sys.path and bench/kernels.py would shadow the kernels package.
      proc = subprocess.Popen([sys.executable, "-m", "bench.scale_plan", "--worker", "--cases",
                               case_file, "--output", out_file], env=env, cwd=ROOT)
      proc.wait()
      if os.path.exists(out_file):
        records += [json.loads(line) for line in open(out_file)]
      meta["load_end"] = load()
      write_report(records, args.out, meta)  # after each mesh: partial results survive
  print(open(args.out + ".md").read())


if __name__ == "__main__":
  main()
