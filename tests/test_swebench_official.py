"""BPO-SWEBench-v0's docker backend over images in the official SWE-bench layout.

The image is built offline by ``bpo_envs.swebench.images.build_test_image`` (the set-up script
builds it too): ``sweb.eval.x86_64.<id>:latest`` with a conda-style ``testbed`` env activated by
``/root/.bashrc``, whose ``python`` is not the base image's. Rows are Verified-format: no
``repo_path`` and no ``image``, so the image is found by its official name. Needs a Docker
daemon and the base image; skips otherwise.
"""

from __future__ import annotations

import io
import tarfile

import pytest

pytest.importorskip("swebench", reason="needs the swe extra: pip install 'bpo-gym[swe]'")
docker = pytest.importorskip("docker", reason="needs docker-py: pip install 'bpo-gym[swe]'")

from docker_support import docker_problem  # noqa: E402

from bpo_envs.swebench import SWEBenchEnv, bundled_instances  # noqa: E402
from bpo_envs.swebench.images import (  # noqa: E402
    ImageStore,
    build_test_image,
    official_names,
    verified_row,
)

_PROBLEM = docker_problem()
pytestmark = pytest.mark.skipif(_PROBLEM is not None, reason=_PROBLEM or "")
ENV_CHECK = "python -c 'import bpo_testbed_env'"  # only the testbed env has this module


@pytest.fixture(scope="module")
def client():
    return docker.from_env()


@pytest.fixture(scope="module")
def row(client):
    source = bundled_instances()[0]
    build_test_image(source, client)
    return verified_row(source)


def _variant(row, suffix, test_cmd):
    # a distinct version: swebench's spec table is keyed by (repo, version)
    return {**row, "version": f"{row['version']}-{suffix}", "test_cmd": test_cmd}


def _gold(env, task_id=None):
    env.reset(options={"task_id": task_id} if task_id else None)
    for action in env.expert_actions():
        obs, reward, terminated, truncated, info = env.step(action)
    return obs, reward, info


def test_official_names_match_swebench(row):
    from swebench.harness.test_spec.test_spec import TestSpec

    spec = TestSpec(instance_id="django__django-11099", repo="django/django", version="3.0",
                    repo_script_list=[], eval_script_list=[], env_script_list=[], arch="x86_64",
                    FAIL_TO_PASS=[], PASS_TO_PASS=[], language="py", docker_specs={},
                    namespace="swebench")
    local, hub = official_names("django__django-11099")
    assert hub == spec.instance_image_key
    assert local == "sweb.eval.x86_64.django__django-11099:latest"


def test_verified_row_resolves_with_gold_patch_in_the_testbed_env(row):
    # grading too runs in the testbed env: the test command fails without its marker module
    graded = _variant(row, "envcheck", f"{ENV_CHECK} && {row['test_cmd']}")
    env = SWEBenchEnv(instances=[graded], backend="docker", step_timeout=30)
    try:
        env.reset()
        obs, _, _, _, info = env.step(
            "which python pytest; python -c 'import sys, bpo_testbed_env; print(sys.prefix)'; "
            "echo env=$CONDA_DEFAULT_ENV; pwd"
        )
        lines = obs.splitlines()
        assert lines[:5] == ["/opt/miniconda3/envs/testbed/bin/python",
                             "/opt/miniconda3/envs/testbed/bin/pytest",
                             "/opt/miniconda3/envs/testbed", "env=testbed", "/testbed"]
        assert env._backend.instance_image(graded) == official_names(row["instance_id"])[0]
        obs, reward, info = _gold(env)
        assert reward == 1.0 and info["resolved"] and "grading_hint" not in info
        assert "passed" in info["test_output"]
    finally:
        env.close()


def test_grading_network_is_off_by_default_and_can_be_opted_into(row):
    netcheck = _variant(row, "net", f"test -e /sys/class/net/eth0 && {row['test_cmd']}")
    for kwargs, resolved in (({}, False), ({"grading_network": True}, True)):
        env = SWEBenchEnv(instances=[netcheck], backend="docker", **kwargs)
        try:
            obs, reward, info = _gold(env)
            assert info["resolved"] is resolved
            if not resolved:  # the test command never ran: every PASS_TO_PASS test failed
                assert info["pass_to_pass"] == 0.0 and "did not run" in info["grading_hint"]
                assert "grading hint" in obs and info["test_output"]
            # the agent's own container has no network either way
            env.reset()
            assert env.step("ls /sys/class/net")[0].split()[0] == "lo"
        finally:
            env.close()


def test_namespaced_image_name_is_found(client):
    source = bundled_instances()[1]
    local, hub = official_names(source["instance_id"])
    build_test_image(source, client)
    client.images.get(local).tag(hub)
    client.images.remove(local)
    try:
        env = SWEBenchEnv(instances=[verified_row(source)], backend="docker")
        try:
            assert env._backend.instance_image(env.instance(source["instance_id"])) == hub
            assert _gold(env)[1] == 1.0
        finally:
            env.close()
    finally:
        client.images.remove(hub)


def _tiny_image(client, name):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("marker.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"ok"))
    client.api.import_image_from_data(buf.getvalue(), repository=name.split(":")[0], tag="latest")


@pytest.mark.parametrize("file_name", ["sweb.eval.x86_64.bpo-gym__tiny-1.tar", "saved.tar"])
def test_images_dir_tarball_is_loaded(client, tmp_path, file_name):
    iid = "bpo-gym__tiny-1"
    names = official_names(iid)
    _tiny_image(client, names[0])
    with open(tmp_path / file_name, "wb") as fh:
        for chunk in client.images.get(names[0]).save(named=True):
            fh.write(chunk)
    client.images.remove(names[0])
    try:
        store = ImageStore(client, tmp_path)
        assert store.present(names) is None and store.available(iid, names)
        assert store.find(iid, names) == names[0]  # by file name, or by manifest tags
    finally:
        client.images.remove(names[0])


def test_missing_image_says_how_to_make_it(row, tmp_path):
    missing = {**row, "instance_id": "nobody__nothing-1"}
    with pytest.raises(RuntimeError) as err:
        SWEBenchEnv(instances=[missing], backend="docker", images_dir=tmp_path)
    text = str(err.value)
    assert "sweb.eval.x86_64.nobody__nothing-1:latest" in text
    assert "swebench/sweb.eval.x86_64.nobody_1776_nothing-1:latest" in text
    assert "prepare_images" in text and "docker save" in text and str(tmp_path) in text
