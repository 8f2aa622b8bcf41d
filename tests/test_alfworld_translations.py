"""ALFWorld translations made ahead of need (bpo_envs/alfworld/translations.py): the missing ones
are found, made once, and then read back by the env instead of made again."""

from __future__ import annotations

import pytest

from bpo_envs.alfworld import _upstream, engine, translations
from bpo_envs.alfworld.env import ALFWorldEnv

KWARGS = {"split": "train", "max_episode_steps": 5}


@pytest.fixture
def private_translations(tmp_path, monkeypatch):
    """Translations written into (and read from) a fresh folder; the games stay the user's. The
    process's cache starts empty too: a game an earlier test in this process loaded would not
    be translated, so not written (the test's result would hang on the order tests run in)."""
    _upstream.clear_translation_cache()

    def path(game):
        return tmp_path / f"{_upstream._game_digest(game)}{_upstream.TRANSLATION_SUFFIX}"

    monkeypatch.setattr(_upstream, "translation_path", path)
    monkeypatch.setattr(translations, "translation_path", path)
    monkeypatch.setattr(translations, "_ENVS", {})
    return tmp_path


def test_missing_translations_are_made_once_and_then_read(private_translations, monkeypatch):
    tasks = ALFWorldEnv(**KWARGS).task_ids()[:2]
    assert translations.untranslated(KWARGS, tasks) == tasks
    assert translations.make_translations(KWARGS, tasks, workers=1, progress=False) == 2
    assert len(list(private_translations.iterdir())) == 2
    assert translations.untranslated(KWARGS, tasks) == []
    assert translations.make_translations(KWARGS, tasks, workers=1, progress=False) == 0
    # a fresh env (a job's process) reads them: no game is translated again
    monkeypatch.setattr(engine, "save_translation", lambda *a: pytest.fail("a game was translated again"))
    fresh = ALFWorldEnv(**KWARGS)
    for task in tasks:
        _upstream._TRANSLATIONS.clear()
        _upstream._LOGIC_PARSES.clear()
        fresh.reset(options={"task_id": task})
