"""bpo-memory-plan: parameter counts of the bundled configs, the plan's arithmetic, the CLI."""

from __future__ import annotations

import pytest

from bpo_algos.memory_plan import ModelShape, load_config, main, plan


@pytest.mark.parametrize(("name", "billions"), [("qwen2.5-7b-instruct", 7.62), ("llama-3.1-8b-instruct", 8.03)])
def test_bundled_configs_give_the_published_parameter_counts(name, billions):
    assert ModelShape.from_config(load_config(name)).params() / 1e9 == pytest.approx(billions, abs=0.01)


def test_full_fine_tune_is_16_bytes_a_parameter_and_fsdp_divides_it():
    config = load_config("qwen2.5-7b-instruct")
    shape = ModelShape.from_config(config)
    p = shape.params()
    one = plan(config, gpus=1, gpu_gb=141)
    assert (one.weights + one.gradients + one.optimizer) * 1e9 == pytest.approx(16 * p)
    assert not one.fits  # 122 GB of states plus activations and KV do not fit one H200
    eight = plan(config, gpus=8, gpu_gb=80)
    assert eight.optimizer == pytest.approx(one.optimizer / 8) and eight.fits
    # TrainerConfig(fsdp=True) holds the full bf16 weights through collection and the update
    assert eight.weights * 1e9 == pytest.approx(4 * p / 8 + 2 * p)
    assert plan(config, gpus=8, gpu_gb=80, kl=True).reference * 1e9 == pytest.approx(2 * p)  # not sharded
    lora = plan(config, gpus=1, gpu_gb=141, lora=True)
    assert lora.fits and lora.weights * 1e9 == pytest.approx(2 * p + 4 * shape.lora_params(8))
    assert lora.optimizer * 1e9 == pytest.approx(8 * shape.lora_params(8))


def test_cli_prints_a_table_and_fails_when_it_does_not_fit(tmp_path, capsys):
    main(["--model", "llama-3.1-8b-instruct", "--gpus", "1", "--gpu-gb", "141", "--lora"])
    assert "| yes |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--model", "llama-3.1-8b-instruct", "--gpus", "1", "--gpu-gb", "141"])
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_config(tmp_path / "nothing")
    bad = tmp_path / "config.json"
    bad.write_text('{"hidden_size": 8}')
    with pytest.raises(ValueError, match="lacks"):
        plan(load_config(tmp_path))
