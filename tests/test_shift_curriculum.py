"""train.shift_frozen_steps: the token shift held at its zero init for the first N updates.

The optimiser holds exactly the TokenShift weights (found by their module names in a real
model), gives them zero update and zero moments while held, trains them afterwards, and leaves
every other weight training throughout; configs that could not mean it are refused by name.
The freeze shared with warm_start (train_only_new) is the same transformation. While the
shift is held, training is the plain model's, update for update (same init, data, schedule).
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util

from chunkformer import config as config_lib
from chunkformer import train_state as state_lib
from chunkformer import trainer, warm_start
from chunkformer.config import ConfigError, ModelConfig, TrainConfig
from chunkformer.evaluation.records.variant import VariantSetup
from configs import smoke
from tests.checkpoint_params import params_at

HELD = 3


def _params():
  return {"block": {"qkv": {"k": {"kernel": jnp.ones((4, 2))},
                            "key_shift": {"shift_1": jnp.zeros((4, 2))},
                            "value_shift": {"shift_1": jnp.zeros((4, 2))}},
                    "norm": {"scale": jnp.ones((4,))}}}


def _run(tx, params, steps):
  """``steps`` updates with a constant gradient of ones; the params and state after each."""
  state = tx.init(params)
  grads = jax.tree.map(jnp.ones_like, params)
  history = []
  for _ in range(steps):
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
    history.append((params, state))
  return history


def test_shift_weights_stay_zero_while_held_and_train_afterwards():
  train = TrainConfig(steps=10, warmup_steps=0, learning_rate=0.1, shift_frozen_steps=HELD)
  history = _run(state_lib.make_optimizer(train), _params(), HELD + 1)
  for step, (params, state) in enumerate(history, start=1):
    shifts = [params["block"]["qkv"][name]["shift_1"] for name in ("key_shift", "value_shift")]
    if step <= HELD:
      for w in shifts:
        np.testing.assert_array_equal(w, 0.0)
      adam = state.inner[1][0]  # chain(clip, adamw): adamw = chain(scale_by_adam, ...)
      np.testing.assert_array_equal(adam.mu["block"]["qkv"]["key_shift"]["shift_1"], 0.0)
      np.testing.assert_array_equal(adam.nu["block"]["qkv"]["value_shift"]["shift_1"], 0.0)
    else:
      for w in shifts:
        assert np.all(np.asarray(w) < 0), f"step {step}: the shift should train once released"
    kernel = params["block"]["qkv"]["k"]["kernel"]
    assert np.all(np.asarray(kernel) < 1.0), f"step {step}: the other weights train throughout"
  assert int(history[-1][1].count) == HELD + 1


def test_without_a_held_shift_the_optimiser_is_plain_adamw():
  plain = TrainConfig(steps=10, warmup_steps=0, learning_rate=0.1)
  tx = state_lib.make_optimizer(plain)
  assert not isinstance(tx.init(_params()), state_lib.FreezeState)  # checkpoints unchanged
  params, _ = _run(tx, _params(), 1)[0]
  assert np.all(np.asarray(params["block"]["qkv"]["key_shift"]["shift_1"]) < 0)


def test_the_held_weights_are_exactly_the_models_token_shifts():
  model = ModelConfig(vocab_size=32, num_layers=2, d_model=16, num_heads=2, num_kv_heads=2,
                      head_dim=8, mlp_dim=32, key_shift=3, value_shift=True, query_shift=True)
  paths = warm_start.param_shapes(model)
  held = sorted("/".join(p) for p in paths if state_lib.is_token_shift(p))
  # per layer: the key, value and query shifts, each with width - 1 = 2 matrices
  assert len(held) == 2 * 3 * 2, held
  assert all(p.rsplit("/", 1)[1] in ("shift_1", "shift_2") for p in held)
  no_shift = ModelConfig(vocab_size=32, num_layers=2, d_model=16, num_heads=2, num_kv_heads=2,
                         head_dim=8, mlp_dim=32)
  assert not any(state_lib.is_token_shift(p) for p in warm_start.param_shapes(no_shift))


@pytest.mark.parametrize("changes, message", [
    ({"train": {"shift_frozen_steps": 5}}, "model.key_shift = 0"),
    ({"train": {"shift_frozen_steps": 20, "steps": 20}, "model": {"key_shift": 2}},
     "below train.steps=20"),
    ({"train": {"shift_frozen_steps": -1}, "model": {"key_shift": 2}}, "must be >= 0"),
])
def test_configs_that_cannot_mean_a_held_shift_are_refused_by_field(changes, message):
  base = config_lib.to_dict(config_lib.Config())
  for section, values in changes.items():
    base[section].update(values)
  with pytest.raises(ConfigError, match="train.shift_frozen_steps") as err:
    config_lib.from_dict(base).validate()
  assert message in str(err.value)


def test_results_written_before_the_field_read_back_with_the_shift_trained_throughout():
  setup = VariantSetup("fixed_m4_kv2_shift3", "fixed", "fixed+shift3", key_shift=True,
                       key_shift_width=3)
  stored = setup.to_json()
  assert "key_shift_frozen_steps" not in stored  # such files are written as before
  chex.assert_equal(VariantSetup.from_json(stored), setup)
  late = VariantSetup("late", "fixed", "fixed+shift3@5", key_shift=True, key_shift_width=3,
                      key_shift_frozen_steps=5)
  assert late.to_json()["key_shift_frozen_steps"] == 5
  assert VariantSetup.from_json(late.to_json()) == late


def _trained(tmp_path, name, **model):
  """The smoke config, 4 updates with a checkpoint after each; params after 3 and 4."""
  c = smoke.get_config()
  c.train.update(steps=4, checkpoint_every=1, keep_checkpoints=4, eval_every=100)
  c.model.update(model)
  if model.get("key_shift"):
    c.train.shift_frozen_steps = HELD
  config = config_lib.from_dict(c.to_dict())
  workdir = str(tmp_path / name)
  trainer.train(config, workdir)
  return [traverse_util.flatten_dict(params_at(workdir, config, step))
          for step in (HELD, HELD + 1)]


def test_while_held_the_run_is_the_plain_models_and_the_shift_trains_after(tmp_path):
  plain = _trained(tmp_path, "plain", key_shift=0)
  held = _trained(tmp_path, "held", key_shift=2)
  shifts = {k for k in held[0] if state_lib.is_token_shift(k)}
  assert shifts and set(held[0]) - shifts == set(plain[0])
  for k in shifts:
    np.testing.assert_array_equal(held[0][k], 0.0)
    assert np.abs(np.asarray(held[1][k])).max() > 0
  for k in plain[0]:  # same init, data and schedule: the same run up to float rounding
    np.testing.assert_allclose(held[0][k], plain[0][k], rtol=1e-5, atol=1e-6, err_msg=str(k))
