"""WebShop data: upstream-format files, bad files, human goals, splits, the generator, and
property tests that no action string raises."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

pytest.importorskip("rapidfuzz")
pytest.importorskip("bm25s")

import bpo_envs  # noqa: E402
from bpo_envs.webshop import WebShopDataError, WebShopEnv, generate_catalog  # noqa: E402
from bpo_envs.webshop.data import find_data_files, get_catalog  # noqa: E402
from bpo_envs.webshop.generator import PRODUCT_TYPES  # noqa: E402
from bpo_envs.webshop.reward import _fuzz_process, normalize_color  # noqa: E402


def _record(asin, name, query, options, pricing="$10.00", **extra):
    record = {
        "asin": asin, "name": name, "category": "beauty", "query": query,
        "product_category": "Beauty & Personal Care › Personal Care › Deodorants",
        "full_description": f"{name}. Great for sensitive skin.", "small_description": [f"About {name}"],
        "pricing": pricing, "customization_options": options, "images": ["x.jpg"],
    }  # fmt: skip
    record.update(extra)
    return record


def _opts(**groups):
    return {k.replace("_", " "): [{"value": v, "image": None} for v in vs] for k, vs in groups.items()}


PRODUCTS = [
    _record("B000000001", "Citrus Deodorant Stick", "deodorant", _opts(scent=["Bright Citrus", "Lavender"], size=["3 oz", "5/6 oz"])),
    _record("B000000002", "Lavender Deodorant Spray", "deodorant", None, pricing="$12.00 - $18.00"),
    _record("B000000003", "Mint Toothpaste Tube", "toothpaste", {}, pricing=""),
    _record("nan", "skipped", "x", {}),
    _record("B000000001", "duplicate", "x", {}),
]  # fmt: skip
INS = {
    "B000000001": {"attributes": ["long lasting"], "instruction": "i need a long lasting deodorant", "instruction_attributes": ["long lasting"]},
    "B000000002": {"attributes": ["aluminum free"], "instruction": "i want an aluminum free deodorant spray", "instruction_attributes": ["aluminum free"]},
    "B000000003": {"attributes": ["fresh breath"], "instruction": None, "instruction_attributes": []},
}  # fmt: skip
HUMAN = {
    "B000000001": [
        {"instruction": "i need lavender deodorant in 5/6 oz.", "instruction_attributes": ["sensitive skin"],
         "instruction_options": ["lavender", "5/6 oz"]},
        {"instruction": "no attributes here", "instruction_attributes": [], "instruction_options": []},
    ],
    "B000000003": [
        {"instruction": "find mint toothpaste", "instruction_attributes": ["mint"], "instruction_options": []},
    ],
}  # fmt: skip


def _write(folder, products=PRODUCTS, ins=INS, human=None, names=("items_shuffle_1000.json", "items_ins_v2_1000.json")):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / names[0]).write_text(json.dumps(products))
    (folder / names[1]).write_text(json.dumps(ins))
    if human is not None:
        (folder / "items_human_ins.json").write_text(json.dumps(human))
    return folder


def test_upstream_files_are_cleaned_as_upstream(tmp_path):
    catalog = get_catalog(_write(tmp_path / "d"))
    assert [p["asin"] for p in catalog.products] == ["B000000001", "B000000002", "B000000003"]
    first, second, third = catalog.products
    assert first["options"] == {"scent": ["bright citrus", "lavender"], "size": ["3 oz", "5 | 6 oz"]}
    assert second["options"] == {} and third["options"] == {}
    assert (first["Price"], second["Price"], third["Price"]) == ("$10.0", "$12.0 to $18.0", "$100.0")
    assert 12.0 <= catalog.prices[1] <= 18.0 and catalog.prices[2] == 100.0
    assert first["Attributes"] == ["long lasting"]
    # synthetic goals: 2 x 2 option combinations + 1 for the optionless product with an instruction
    assert catalog.goal_mode == "synthetic" and len(catalog.goals) == 5
    texts = sorted(catalog.goal(i)["instruction_text"] for i in range(5))
    assert texts[0].startswith(
        "i need a long lasting deodorant with scent: bright citrus, and size: 3 oz, and price lower than "
    )
    assert any(t.startswith("i want an aluminum free deodorant spray, and price lower than") for t in texts)


def test_full_size_file_names_are_read(tmp_path):
    folder = _write(tmp_path / "full", names=("items_shuffle.json", "items_ins_v2.json"))
    files = find_data_files(folder)
    assert files["product"].name == "items_shuffle.json" and files["attribute"].name == "items_ins_v2.json"


def test_human_goals_and_the_expert(tmp_path):
    folder = _write(tmp_path / "h", human=HUMAN)
    env = gym.make("BPO-WebShop-v0", data_dir=str(folder))
    catalog = env.unwrapped.catalog
    assert catalog.goal_mode == "human" and len(catalog.goals) == 2  # the attribute-less one skipped
    for task in env.unwrapped.task_ids():
        env.reset(options={"task_id": task})
        goal = env.unwrapped.goal
        assert isinstance(goal["goal_options"], list)
        assert not goal["instruction_text"].split(",")[0].endswith(".")  # upstream strips the period
        for a in env.unwrapped.expert_actions():
            obs, reward, term, trunc, info = env.step(a)
        assert term and info["won"], (goal, info)
    synthetic = gym.make("BPO-WebShop-v0", data_dir=str(folder), goals="synthetic").unwrapped
    assert synthetic.catalog.goal_mode == "synthetic"


def test_proportional_splits_on_small_data(tmp_path):
    env = WebShopEnv(data_dir=str(_write(tmp_path / "s")), split="test")
    assert list(env.task_ids()) == [0]
    assert list(WebShopEnv(data_dir=str(tmp_path / "s"), split="eval").task_ids()) == [1]
    assert list(WebShopEnv(data_dir=str(tmp_path / "s"), split="train").task_ids()) == [2, 3, 4]


def test_missing_files_name_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        WebShopEnv(data_dir=str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="items_shuffle_1000.json or items_shuffle.json"):
        WebShopEnv(data_dir=str(tmp_path / "empty"))
    (tmp_path / "noattr").mkdir()
    (tmp_path / "noattr" / "items_shuffle_1000.json").write_text("[]")
    with pytest.raises(FileNotFoundError, match="items_ins_v2_1000.json or items_ins_v2.json"):
        WebShopEnv(data_dir=str(tmp_path / "noattr"))
    with pytest.raises(FileNotFoundError, match="items_human_ins.json"):
        WebShopEnv(data_dir=str(_write(tmp_path / "nohuman")), goals="human")


def test_malformed_json_names_the_file(tmp_path):
    folder = _write(tmp_path / "bad")
    (folder / "items_shuffle_1000.json").write_text('[{"asin": "B1",')
    with pytest.raises(WebShopDataError, match=r"items_shuffle_1000\.json: not valid JSON"):
        WebShopEnv(data_dir=str(folder))
    (folder / "items_shuffle_1000.json").write_text('{"asin": "B1"}')
    with pytest.raises(WebShopDataError, match="expected a JSON list of product records"):
        WebShopEnv(data_dir=str(folder))


def test_product_without_options_key_is_a_clear_error(tmp_path):
    broken = [dict(PRODUCTS[0])]
    del broken[0]["customization_options"]
    with pytest.raises(WebShopDataError, match=r"product #0 \(asin 'B000000001'\) lacks the key\(s\) \['customization_options'\]"):
        WebShopEnv(data_dir=str(_write(tmp_path / "noopt", products=broken)))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"customization_options": {"size": "large"}}, "option 'size' must be a list"),
        ({"customization_options": ["size"]}, "'customization_options' must be an object"),
        ({"pricing": "$abc"}, "cannot read the price"),
        ({"name": None}, "'name' must be a string"),
    ],
)
def test_bad_product_fields(tmp_path, change, message):
    products = [dict(PRODUCTS[0], **change)]
    with pytest.raises(WebShopDataError, match=message):
        WebShopEnv(data_dir=str(_write(tmp_path / "f", products=products)))


def test_no_goals_is_a_clear_error(tmp_path):
    ins = {k: dict(v, instruction=None) for k, v in INS.items()}
    with pytest.raises(WebShopDataError, match="no synthetic goals"):
        WebShopEnv(data_dir=str(_write(tmp_path / "ng", ins=ins)))


def test_products_with_no_options_at_all_work(tmp_path):
    products = [dict(p, customization_options={}) for p in PRODUCTS[:3]]
    env = WebShopEnv(data_dir=str(_write(tmp_path / "plain", products=products)))
    assert len(env.task_ids()) == 2
    for task in env.task_ids():
        env.reset(options={"task_id": task})
        assert env.goal["goal_options"] == {}
        for a in env.expert_actions():
            *_, info = env.step(a)
        assert info["won"]
    bpo_envs.check_snapshot(env, seed=0, steps=10, fresh_env=False)


def test_generator_is_deterministic_and_upstream_shaped():
    a, b = generate_catalog(60, seed=3), generate_catalog(60, seed=3)
    assert a == b and a != generate_catalog(60, seed=4)
    products, ins = a["items_shuffle.json"], a["items_ins_v2.json"]
    assert len(products) == 60 and set(ins) == {p["asin"] for p in products}
    categories = {p["category"] for p in products}
    assert categories == {"beauty", "electronics", "fashion", "food", "furniture"}
    for p in products:
        assert p["pricing"].startswith("$") and p["product_category"].count("›") >= 2
        assert all(len(i["instruction_attributes"]) >= 1 for i in [ins[p["asin"]]])


def test_generator_option_values_survive_colour_normalisation():
    # upstream's normalize_color takes the first colour *substring*; a value like "blueberry"
    # would become "blue", which then fails the fuzzy match of a synthetic goal's (name, value)
    for ptype in PRODUCT_TYPES:
        for _, values in ptype.options:
            for v in values:
                c = normalize_color(v)
                assert c == v or c in _fuzz_process(v).split(), (ptype.noun, v, c)


# ---- property tests: bad model output is an observation, never an exception -------------

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_ENV = None
_SNAPS = []


def _env_and_snaps():
    global _ENV
    if _ENV is None:
        _ENV = gym.make("BPO-WebShop-v0")
        _ENV.reset(options={"task_id": 17})
        actions = _ENV.unwrapped.expert_actions()
        for a in actions[:-1]:
            _SNAPS.append(bpo_envs.snapshot(_ENV))
            _ENV.step(a)
        _SNAPS.append(bpo_envs.snapshot(_ENV))
        _ENV.step("click[features]")
        _SNAPS.append(bpo_envs.snapshot(_ENV))
    return _ENV, _SNAPS


_actions = st.one_of(
    st.text(max_size=300),
    st.binary(max_size=200).map(lambda b: b.decode("utf-8", errors="replace")),
    st.builds(lambda v, a: f"{v}[{a}]", st.sampled_from(["search", "click", "Click", "", "buy"]), st.text(max_size=80)),
    st.text(alphabet="[]$;|&`\\\n\t<>'\" ", max_size=60),
    st.integers(0, 20_000).map(lambda n: "search[" + "x" * n + "]"),
    st.integers(0, 20_000).map(lambda n: "[" * n + "]" * (n // 2)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(action=_actions, which=st.integers(0, 10))
def test_random_action_strings_never_raise(action, which):
    env, snaps = _env_and_snaps()
    bpo_envs.restore(env, snaps[which % len(snaps)])
    obs, reward, term, trunc, info = env.step(action)
    assert isinstance(obs, str) and env.observation_space.contains(obs)
    assert 0.0 <= reward <= 1.0
    assert info["invalid_action"] if "Invalid action" in obs[:15] else True
    assert "admissible_actions" in info and info["task_id"] == 17
