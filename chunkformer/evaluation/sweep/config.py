"""Sweep configs: what a ``configs/sweeps/*.py`` file holds, resolved and checked up front.

A sweep config is an ``ml_collections`` file like a training config (same ``--config`` flag,
``lock_config``), marked by a top-level ``sweep`` field:

  sweep:      settings (``SweepSettings`` below) and the probes it runs (``sweep.probes``,
              ``probe_settings``; ``--config.sweep.probes.needle_sweep.num_haystacks=64``
              works; the flat fields of older configs are read as the same probes)
  overrides:  nested fields applied to every variant's train config first (may be empty)
  variants:   name -> {config: train config file ("path[:arg]"), overrides: nested fields,
              checkpoint: an existing finished run directory instead of training ("" = train)}

``resolve`` turns it into frozen ``Variant``s with validated ``Config``s and checks everything
that can fail before any training or writing: unknown config files, unknown override fields,
attention kinds not implemented, runs in ``DIR/<variant>`` that hold a different config,
checkpoint directories without a finished run, sweep windows that do not fit the sequence.
Every error is a ConfigError naming the variant and the field.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
from collections.abc import Mapping
from typing import Any

import jax
import ml_collections

from chunkformer import attention
from chunkformer import config as config_lib
from chunkformer import workdir as workdir_lib
from chunkformer.config import Config, ConfigError, ModelConfig
from chunkformer.evaluation.claims import rules as claim_rules
from chunkformer.evaluation.probes import instruments, needle_sweep, prefix_probe
from chunkformer.evaluation.probes import registry as probe_registry
from chunkformer.evaluation.probes import trained as trained_lib
from chunkformer.evaluation.sweep import probe_settings

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
  os.path.abspath(__file__)))))  # chunkformer/evaluation/sweep/config.py -> the repository
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
COMPRESSED_KINDS = ("fixed", "dynamic")


@dataclasses.dataclass(frozen=True)
class SweepSettings:
  """``config.sweep``. Token counts in tokens."""

  name: str = "sweep"  # report title
  seed: int = 0  # added to every variant's config.seed; seeds haystacks and statistics too
  order: tuple[str, ...] = ()  # variants to run, in table order (empty: all, sorted by name)
  reference_chunk_size: int = 4  # M used for the phases of variants without chunks (full)
  eval_batch_size: int = 64  # rows per jitted forward pass
  num_resamples: int = 2000  # bootstrap resamples
  num_permutations: int = 2000  # permutation-test permutations
  # The probes of ``probes.registry.PROBES`` run on every unit: name -> its options, all of
  # them (``probe_settings``; ``sweep.probes.key_overlap = dict(rows=256)`` adds one,
  # ``sweep.probes.slot_gain = None`` drops one). Default: the built-ins every sweep runs.
  probes: Mapping[str, Mapping[str, Any]] = dataclasses.field(
      default_factory=probe_settings.defaults)
  # The pre-registered analysis plan (a committed file; relative to the cwd or the
  # repository): its sha256 and commit are recorded when a unit trains, and the judge flags
  # units trained under another plan or none (docs/claims.md). "" = no plan.
  plan: str = ""
  # The version of the claim rules that decides this sweep's verdicts (``claims.rules``): the
  # current one when the sweep is first judged; a sweep judged again keeps the version it
  # stored, and the report shows the current rules' verdicts beside.
  rules: str = claim_rules.CURRENT

  def to_json(self) -> dict[str, Any]:
    """The settings as results.json stores them (without ``plan`` when there is none, as
    sweeps before it wrote them)."""
    out = dataclasses.asdict(self)
    if not self.plan:
      out.pop("plan")
    return out


@dataclasses.dataclass(frozen=True)
class Variant:
  name: str
  source: str  # the train config file ("path[:arg]"), or the checkpoint directory
  overrides: dict[str, Any]  # dotted field -> value, as applied (shared ones first)
  config: Config
  workdir: str  # where it is (or will be) trained
  train: bool  # False: an existing finished run given by ``checkpoint``


@dataclasses.dataclass(frozen=True)
class Sweep:
  settings: SweepSettings
  variants: tuple[Variant, ...]
  workdir: str
  shared_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)  # every variant's

  @property
  def chunk_sizes(self) -> tuple[int, ...]:
    """Every M in play: the variants' chunk sizes and the reference, ascending."""
    sizes = {self.settings.reference_chunk_size}
    for variant in self.variants:
      sizes.update(chunk_sizes(variant.config.model))
    return tuple(sorted(sizes))

  @property
  def align(self) -> int:
    return math.lcm(*self.chunk_sizes)

  def runs(self, probe: str) -> bool:
    """Whether the sweep runs ``probe`` (``sweep.probes``)."""
    return probe in self.settings.probes

  def _options(self, probe: str) -> dict[str, Any]:
    """The probe's options (its defaults where the sweep does not run it)."""
    return dict(self.settings.probes.get(probe) or probe_registry.options(probe, {}))

  def needle_spec(self) -> needle_sweep.NeedleSweepSpec:
    return instruments.needle_spec(self.chunk_sizes, self.settings.seed,
                               **self._options("needle_sweep"))

  def prefix_spec(self) -> prefix_probe.PrefixSpec:
    return instruments.prefix_spec(self.chunk_sizes, self.settings.seed,
                               **self._options("prefix_probe"))

  @property
  def num_offsets(self) -> int:
    return self.needle_spec().num_offsets


# A variant trained with several seeds is one sweep unit per seed, "<variant>_seed<k>"
# (configs/sweeps.seeded_units); records carry the variant and the seed separately.
SEED_SEPARATOR = "_seed"


def unit_variant(unit: str) -> str:
  """"fixed_m4_seed2" -> "fixed_m4" (a name without a seed suffix is its own variant)."""
  return unit.rsplit(SEED_SEPARATOR, 1)[0] if SEED_SEPARATOR in unit else unit


def is_sweep_config(config: Any) -> bool:
  return isinstance(config, (ml_collections.ConfigDict, Mapping)) and "sweep" in config


def chunk_sizes(model: ModelConfig) -> tuple[int, ...]:
  """Distinct M (fixed) or target chunk lengths (dynamic) over the layers, in layer order."""
  sizes = []
  for layer in model.layers:
    if layer.kind in COMPRESSED_KINDS and layer.chunk_size not in sizes:
      sizes.append(layer.chunk_size)
  return tuple(sizes)


def _plain(value: Any) -> Any:
  return value.to_dict() if isinstance(value, ml_collections.ConfigDict) else value


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  """Nested overrides -> {"model.attention.chunk_size": 8, ...}."""
  out = {}
  for key, value in _plain(tree).items():
    if isinstance(value, Mapping):
      out.update(flatten(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def load_config_file(spec: str, field: str) -> ml_collections.ConfigDict:
  """``get_config([arg])`` of the file ``path[:arg]`` (relative to the cwd or the repository)."""
  path, _, arg = spec.partition(":")
  candidates = [path] if os.path.isabs(path) else [path, os.path.join(REPO_ROOT, path)]
  found = next((p for p in candidates if os.path.isfile(p)), None)
  if found is None:
    places = ", ".join(dict.fromkeys(os.path.abspath(os.path.dirname(p) or ".")
                                     for p in candidates))
    raise ConfigError(f"config field '{field}': no config file {path!r} (looked in {places})")
  module_spec = importlib.util.spec_from_file_location(
      f"_chunkformer_config_{abs(hash(found))}", found)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
    config = module.get_config(arg) if arg else module.get_config()
  except Exception as e:  # noqa: BLE001 -- any failure of a user file names the file
    raise ConfigError(f"config field '{field}': loading {found!r} failed: "
                      f"{type(e).__name__}: {e}") from e
  if is_sweep_config(config):
    raise ConfigError(f"config field '{field}': {found!r} is a sweep config, not a train config")
  return config


def apply_overrides(base: ml_collections.ConfigDict, overrides: Mapping[str, Any],
                    field: str) -> ml_collections.ConfigDict:
  """A copy of ``base`` with dotted overrides set; unknown fields and bad types name ``field``."""
  config = ml_collections.ConfigDict(base.to_dict())
  config.lock()
  for dotted, value in overrides.items():
    node, parts = config, dotted.split(".")
    for depth, part in enumerate(parts):
      known = list(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
      if part not in known:
        where = ".".join(parts[:depth]) or "the config"
        raise ConfigError(f"config field '{field}.{dotted}': {where} has no field {part!r}; "
                          f"known: {', '.join(sorted(known)) or '(none)'}")
      if depth < len(parts) - 1:
        node = node[part]
    try:
      node[parts[-1]] = value
    except (TypeError, ValueError) as e:
      raise ConfigError(f"config field '{field}.{dotted}': cannot set {value!r}: {e}") from None
  return config


def plan_path(plan: str) -> str | None:
  """The plan file ``sweep.plan`` names (relative to the cwd, then the repository), or None."""
  candidates = [plan] if os.path.isabs(plan) else [plan, os.path.join(REPO_ROOT, plan)]
  return next((os.path.abspath(p) for p in candidates if os.path.isfile(p)), None)


def settings_from(config: ml_collections.ConfigDict) -> SweepSettings:
  fields = {f.name: f for f in dataclasses.fields(SweepSettings)}
  values = probe_settings.from_legacy(_plain(config.sweep))
  for key in values:
    if key not in fields:
      raise ConfigError(f"config field 'sweep.{key}' is unknown; known: {', '.join(fields)} "
                        f"(and the older {', '.join(probe_settings.LEGACY_FIELDS)})")
  values = {k: tuple(v) if isinstance(fields[k].default, tuple) else v for k, v in values.items()}
  values["probes"] = probe_settings.resolve(values.get("probes"))
  settings = SweepSettings(**values)
  for key in ("eval_batch_size", "reference_chunk_size", "num_resamples", "num_permutations"):
    if getattr(settings, key) < 1:
      raise ConfigError(f"config field 'sweep.{key}': must be >= 1, got {getattr(settings, key)}")
  if settings.seed < 0:
    raise ConfigError(f"config field 'sweep.seed': must be >= 0, got {settings.seed}")
  if settings.rules not in claim_rules.RULES:
    raise ConfigError(f"config field 'sweep.rules': unknown claim-rules version "
                      f"{settings.rules!r}; known: {', '.join(sorted(claim_rules.RULES))}")
  if settings.plan and plan_path(settings.plan) is None:
    raise ConfigError(f"config field 'sweep.plan': no plan file {settings.plan!r} (looked in "
                      f"{os.getcwd()} and {REPO_ROOT})")
  if settings.eval_batch_size % jax.device_count():
    raise ConfigError(f"config field 'sweep.eval_batch_size': {settings.eval_batch_size} rows do "
                      f"not split over the {jax.device_count()} devices")
  return settings


def _variant(name: str, entry: Mapping[str, Any], shared: dict[str, Any], settings: SweepSettings,
             workdir: str) -> Variant:
  field = f"variants.{name}"
  entry = _plain(entry)
  unknown = set(entry) - {"config", "overrides", "checkpoint"}
  if unknown:
    raise ConfigError(f"config field '{field}': unknown keys {sorted(unknown)}; a variant has "
                      "config, overrides and checkpoint")
  own = flatten(entry.get("overrides") or {})
  checkpoint = entry.get("checkpoint") or ""
  if checkpoint:
    if own or entry.get("config"):
      raise ConfigError(f"config field '{field}': a checkpoint variant is evaluated as trained; "
                        "it takes no config file and no overrides")
    config = trained_lib.finished_config(checkpoint)
    return Variant(name, checkpoint, {}, config, checkpoint, train=False)
  source = entry.get("config") or ""
  if not source:
    raise ConfigError(f"config field '{field}.config': name a train config file (or give "
                      "checkpoint)")
  base = load_config_file(source, f"{field}.config")
  overrides = dict(shared)
  overrides.update(own)
  try:
    raw = apply_overrides(base, shared, "overrides")
    raw = apply_overrides(raw, own, f"{field}.overrides")
    raw.seed = raw.seed + settings.seed
    config = config_lib.from_dict(raw.to_dict())
  except ConfigError as e:
    raise ConfigError(f"sweep variant {name!r} ({source}): {e}") from None
  for i, layer in enumerate(config.model.layers):
    try:
      attention.attention_class(layer.kind)
    except NotImplementedError as e:
      raise ConfigError(f"sweep variant {name!r} ({source}): config field "
                        f"'model.attention[layer {i}].kind': {e}") from None
  return Variant(name, source, overrides, config, os.path.join(workdir, name), train=True)


def _check_workdir(variant: Variant) -> None:
  """A variant directory holding a different run would be refused mid-sweep: refuse now."""
  if not variant.train:
    return
  other_run = workdir_lib.blocking(
      workdir_lib.recorded_differences(variant.workdir, variant.config) or {})
  if other_run:
    lines = "\n".join(f"  {k}: {a!r} -> {b!r}" for k, (a, b) in other_run.items())
    raise ConfigError(f"sweep variant {variant.name!r}: {variant.workdir!r} holds a run of a "
                      f"different config:\n{lines}\nmove that directory away or rename the "
                      "variant; nothing was changed")


def resolve(config: ml_collections.ConfigDict, workdir: str) -> Sweep:
  """The checked sweep (see module docstring); raises ConfigError, writes nothing."""
  if not is_sweep_config(config):
    raise ConfigError("config field 'sweep' is missing: this is not a sweep config")
  known = {"sweep", "overrides", "variants"}
  unknown = set(config.keys()) - known
  if unknown:
    raise ConfigError(f"config fields {sorted(unknown)} are unknown in a sweep config; "
                      f"known: {', '.join(sorted(known))}")
  settings = settings_from(config)
  definitions = _plain(config.get("variants") or {})
  if not definitions:
    raise ConfigError("config field 'variants': the sweep lists no variants")
  order = settings.order or tuple(sorted(definitions))
  for name in order:
    if name not in definitions:
      hint = ("; on the command line a tuple needs quoted names: "
              "\"--config.sweep.order=('a', 'b')\"" if "," in name else "")
      raise ConfigError(f"config field 'sweep.order': no variant {name!r}{hint}; defined: "
                        f"{', '.join(sorted(definitions))}")
    if not _NAME.fullmatch(name):
      raise ConfigError(f"config field 'variants.{name}': a variant name must be a plain "
                        "directory name (letters, digits, '_', '.', '-')")
  if len(set(order)) != len(order):
    raise ConfigError(f"config field 'sweep.order': names repeat: {order}")
  shared = flatten(config.get("overrides") or {})
  variants = tuple(_variant(name, definitions[name], shared, settings, workdir) for name in order)
  sweep = Sweep(settings, variants, workdir, shared)
  for variant in variants:
    _check_workdir(variant)
  _check_probes(sweep)
  return sweep


def _check_probes(sweep: Sweep) -> None:
  """The built-in probes fit every variant, and each variant has its primary analysis."""
  spec = sweep.needle_spec()
  if sweep.runs("needle_sweep") and spec.num_offsets < 3 * max(sweep.chunk_sizes):
    raise ConfigError(f"config field 'sweep.probes.needle_sweep.num_offsets': {spec.num_offsets} "
                      f"offsets give fewer than 3 periods of the largest chunk size in play "
                      f"({max(sweep.chunk_sizes)}); need >= {3 * max(sweep.chunk_sizes)}")
  for variant in sweep.variants:
    kv = variant.config.data.task == "kv"
    if variant.config.data.task == "lookup":
      if not sweep.runs("lookup") or "prefix" not in sweep.settings.probes["lookup"].get(
          "paddings", ("prefix",)):
        raise ConfigError(
            f"sweep variant {variant.name!r}: a lookup model's primary analysis is the lookup "
            "test in prefix padding; enable sweep.probes.lookup with 'prefix' in its paddings")
      continue
    if not (sweep.runs("prefix_probe") or (kv and sweep.runs("needle_sweep"))):
      raise ConfigError(
          f"sweep variant {variant.name!r}: its primary analysis needs "
          f"{'sweep.probes.needle_sweep or ' if kv else ''}sweep.probes.prefix_probe "
          f"({'a retrieval' if kv else 'a ' + variant.config.data.task} model)")
    try:
      if kv and sweep.runs("needle_sweep"):
        needle_sweep.check_fits(variant.config.data, spec)
      if sweep.runs("prefix_probe"):
        prefix_probe.base_config(variant.config.data, sweep.prefix_spec())
    except needle_sweep.WindowAlignmentError as e:
      raise ConfigError(_alignment_message(sweep, e)) from None
    except ConfigError as e:
      raise ConfigError(f"sweep variant {variant.name!r}: {e}") from None


def _alignment_message(sweep: Sweep, error: Exception) -> str:
  """Why no aligned needle window fits: the lcm of the chunk sizes, and who brings them."""
  brings = {m: [v.name for v in sweep.variants if m in chunk_sizes(v.config.model)]
            for m in sweep.chunk_sizes}
  sizes = ", ".join(f"M={m} ({', '.join(names) or 'sweep.reference_chunk_size'})"
                    for m, names in brings.items())
  return (f"sweep window alignment: {error}; the alignment {sweep.align} is the least common "
          f"multiple of every chunk size in play: {sizes}. Use chunk sizes with a smaller lcm "
          "(e.g. drop or change the variant with the odd size), or a longer data.seq_len")
