"""A deterministic offline generator of ALFWorld-format games for the six ALFWorld task types.

A game is what ``alfworld-generate`` writes to ``game.tw-pddl``: a JSON object
``{pddl_domain, grammar, pddl_problem, solvable, walkthrough}``, plus the ``traj_data.json``
fields that name the task. Everything comes from the ``alfworld`` wheel:

* rooms: the AI2-THOR floor plans shipped in ``alfworld/gen/layouts`` (kitchens 1-30, living
  rooms 201-230, bedrooms 301-330, bathrooms 401-430): their receptacle instances and
  interaction points (``FloorPlanN-openable.json``) and the object classes present
  (``FloorPlanN-objects.json``);
* splits: version 3 draws ``valid_unseen`` from ALFRED's valid_unseen floor plans,
  :data:`ALFRED_VALID_UNSEEN_SCENES` = 10, 219, 308, 424 (one kitchen, living room, bedroom and
  bathroom), and ``train``/``valid_seen`` from alfworld's ``TRAIN_SCENE_NUMBERS`` without them
  (``valid_seen`` under another seed). alfworld ships no split list; the four rooms are those of
  the published ALFRED ``valid_unseen`` trajectories (task folders such as
  ``valid_unseen/pick_and_place_simple-PepperShaker-None-Drawer-10/``,
  ``...-Vase-None-Safe-219/``, ``...-Mug-None-Desk-308/``, ``...-SoapBar-None-CounterTop-424/``
  in ALFWorld's ``json_2.1.1``), and the ALFRED paper counts 4 valid-unseen scenes. Versions 1
  and 2 use alfworld's ``TEST_SCENE_NUMBERS`` (1-6, 201-206, 301-306, 401-406) for
  ``valid_unseen``, which are *not* ALFRED's;
* objects: each carried class the floor plan lists, placed in receptacles that
  ``VAL_RECEPTACLE_OBJECTS`` lets hold it (closed ones included: cabinets, drawers, the
  fridge);
* lamps: nothing in the alfworld wheel records where THOR's lamps stand (the layouts list only
  that a floor plan has a ``DeskLamp``/``FloorLamp``, and ``VAL_RECEPTACLE_OBJECTS`` lists no
  receptacle for either). Version 3 puts one of each lamp the floor plan lists on a desk, side
  table, dresser or shelf (where ALFWorld's own games show a desklamp: "On the sidetable 2,
  you see a desklamp 1"; the text engine needs a floor lamp at a receptacle's location too);
  versions 1-2 use any table-like receptacle;
* versions (:data:`GENERATOR_VERSIONS`, ``generator_version=`` of the env), each reproducible
  (the same games in every process) and cached in its own folder:

  - ``1`` thins a room's receptacles to :data:`MAX_RECEPTACLES` (dropping repeated cabinets
    and drawers), makes 1-3 copies of an object and keeps each lamp the task does not need
    with probability 1/2;
  - ``2`` keeps every receptacle of the room (up to 54 in a kitchen), 1 to
    ``MAX_NUM_OF_OBJ_INSTANCES`` copies of each object and 1 (2 for two-object tasks) to
    ``PICKUP_REPEAT_MAX`` of the task's object (ALFRED's generator settings in
    ``constants.py``), and every lamp of the floor plan. Fast Downward takes minutes on some
    of these games (a two-object task in a 54-receptacle kitchen: over 2 minutes), so
    generating a set of them can stall;
  - ``3`` (default) is version 2 with ALFRED's valid_unseen rooms, the lamp hosts above and a
    deterministic bound on the problem's size, decided before planning: at most
    :data:`MAX_RECEPTACLES_V3` receptacles (77 of the 96 floor plans keep all of theirs; 15
    kitchens, 3 living rooms and 1 bedroom lose repeated cabinets and drawers, as in version
    1) and at most :data:`MAX_PROBLEM_SIZE` ``objects x receptacles`` (extra copies of the most
    repeated object class go first, then whole classes the task does not need). Planner time
    grows steeply with both and varies between rooms of one size (measured on a shared 2-core
    machine, two-object tasks: 24 receptacles and 37 objects 16-19 s, 27 and 33 over 60 CPU s,
    30 and 30 over 60 CPU s in one kitchen and 30 and 40 11 s in another, 54 and 62 over 2
    minutes); at the bound the CPU preset's 32 games took 1.2 s each (median), 27 s at most.
    The bound depends on the problem only, so every machine keeps the same games, and it also
    keeps ``expert_actions()`` (which replans with the planner) to seconds; the planner
    check's CPU-time limit (:mod:`bpo_envs.alfworld.verify`) is a safety net that a kept game
    must not need;
* constraints: ``alfworld/gen/constants.py`` (which receptacle can hold which object, which
  objects are cleanable/heatable/coolable/sliceable/toggleable, which receptacles open);
* goals: the PDDL goals and the goal templates of ``alfworld/gen/goal_library.py``;
* names: THOR object ids (``Cabinet|+00.68|+00.50|-02.20``, ``Sink|...|SinkBasin``) escaped as
  alfworld does (``Cabinet_bar__plus_00_dot_68...``), so alfworld's demangler names them
  ``cabinet 1``, ``sinkbasin 1``...

:func:`generate_problem` is pure: the same ``(task_type, split, index, seed, attempt)`` gives
the same text in every process (its randomness is a ``random.Random`` seeded by a hash, never
the global generator). Checking that the planner solves the game is done by the caller
(:mod:`bpo_envs.alfworld.games`), which retries with the next ``attempt`` when it does not.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from functools import cache
from typing import Any

from bpo_envs.alfworld._upstream import domain_text, grammar_text, upstream

TASK_TYPES: tuple[str, ...] = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
"""The six ALFWorld task types, in alfworld's order (``TASK_TYPES`` 1-6)."""

SPLITS: tuple[str, ...] = ("train", "valid_seen", "valid_unseen")
GENERATOR_VERSIONS: tuple[int, ...] = (1, 2, 3)
GENERATOR_VERSION = 3
"""The default version (see the module docstring)."""
MAX_RECEPTACLES = 24
MAX_RECEPTACLES_V3 = 24
"""Version 3: receptacles kept per room (see the module docstring)."""
MAX_PROBLEM_SIZE = 720
"""Version 3: the most ``objects x receptacles`` a problem may have (see the module docstring)."""
ALFRED_VALID_UNSEEN_SCENES: tuple[int, ...] = (10, 219, 308, 424)
"""The floor plans of ALFRED's ``valid_unseen`` split (one per room type; see the module docstring)."""

# the appliance a task type needs, which is then not also the place to put the object
_APPLIANCE = {
    "pick_clean_then_place_in_recep": ("SinkBasin", "Cleanable"),
    "pick_heat_then_place_in_recep": ("Microwave", "Heatable"),
    "pick_cool_then_place_in_recep": ("Fridge", "Coolable"),
}
_LAMPS = ("DeskLamp", "FloorLamp")
_LAMP_SURFACES = ("SideTable", "Desk", "Dresser", "DiningTable", "CoffeeTable", "TVStand", "Shelf")
# version 3: where a lamp may stand (nothing in the alfworld wheel records it; see the docstring)
_LAMP_HOSTS = {"DeskLamp": ("Desk", "SideTable", "Dresser", "Shelf"), "FloorLamp": ("SideTable", "Desk", "Dresser", "Shelf")}
# classes that appear in canContain lists but are fixtures of the room, not things to carry
_NOT_CARRIED = {"Painting", "Plunger"}
# instances of a static receptacle class that a floor plan lists in objects.json without an
# interaction point (the layouts record points only for receptacles the generator opened)
_SYNTHESISED_COUNT = {"StoveBurner": 4}


def _escape(thor_id: str) -> str:
    """alfworld's ``fix_pddl_str_chars``: THOR id -> PDDL name."""
    table = {"-": "_minus_", "|": "_bar_", "+": "_plus_", ".": "_dot_", ",": "_comma_"}
    return "".join(table.get(ch, ch) for ch in thor_id)


def _rng(*key: Any) -> random.Random:
    digest = hashlib.blake2b(repr(key).encode(), digest_size=16).digest()
    return random.Random(int.from_bytes(digest, "little"))


@dataclass(frozen=True)
class Scene:
    number: int
    room: str
    receptacles: tuple[tuple[str, str, tuple[float, float, int, int]], ...]  # (id, class, point)
    object_classes: tuple[str, ...]


def _receptacle_class(thor_id: str) -> str:
    parts = thor_id.split("|")
    return parts[-1] if len(parts) == 5 else parts[0]


def _room(number: int) -> str:
    for room, numbers in upstream()["constants"].SCENE_TYPE.items():
        if number in numbers:
            return room
    raise ValueError(f"floor plan {number} is not an ALFRED scene")


@cache
def load_scene(number: int) -> Scene:
    """Receptacles (with interaction points) and object classes of AI2-THOR floor plan ``number``."""
    c = upstream()["constants"]
    layouts = upstream()["layouts"]
    points = json.loads((layouts / f"FloorPlan{number}-openable.json").read_text())
    classes = json.loads((layouts / f"FloorPlan{number}-objects.json").read_text())
    static = set(c.RECEPTACLES) - set(c.MOVABLE_RECEPTACLES)
    receptacles = []
    for thor_id in sorted(points):
        cls = _receptacle_class(thor_id)
        if cls in static:
            x, z, rot, hor = points[thor_id]
            receptacles.append((thor_id, cls, (float(x), float(z), int(rot), int(hor))))
    present = {cls for _, cls, _ in receptacles}
    rng = _rng("scene", number)
    for cls in sorted(set(classes) & static - present):
        for _ in range(_SYNTHESISED_COUNT.get(cls, 1)):
            x, z = rng.randint(-12, 12) * 0.25, rng.randint(-12, 12) * 0.25
            y = rng.choice((0.0, 0.9, 1.1))
            thor_id = f"{cls}|{x + 0.1:+06.2f}|{y:+06.2f}|{z + 0.3:+06.2f}"
            if cls.endswith("Basin"):  # THOR names a basin after its fixture: Sink|x|y|z|SinkBasin
                thor_id = f"{cls[: -len('Basin')]}|{thor_id.split('|', 1)[1]}|{cls}"
            receptacles.append((thor_id, cls, (x, z, rng.choice((0, 90, 180, 270)), 30)))
    objects = tuple(sorted(cls for cls in set(classes) if cls not in static))
    return Scene(number, _room(number), tuple(receptacles), objects)


def _thin(receptacles: list, rng: random.Random, limit: int = MAX_RECEPTACLES) -> list:
    """Drop instances of the most repeated classes (cabinets, drawers) down to ``limit``
    (version 1: :data:`MAX_RECEPTACLES`, version 3: :data:`MAX_RECEPTACLES_V3`), keeping one of
    each class."""
    receptacles = list(receptacles)
    while len(receptacles) > limit:
        counts: dict[str, int] = {}
        for _, cls, _ in receptacles:
            counts[cls] = counts.get(cls, 0) + 1
        most = max(sorted(counts), key=counts.__getitem__)
        victims = [i for i, r in enumerate(receptacles) if r[1] == most]
        del receptacles[rng.choice(victims)]
    return receptacles


def _location(point: tuple[float, float, int, int]) -> str:
    x, z, rot, hor = point
    return f"loc|{round(x / 0.25)}|{round(z / 0.25)}|{rot // 90 % 4}|{hor}"


@cache
def _tables() -> dict[str, Any]:
    c = upstream()["constants"]
    holds = {r: frozenset(o) for r, o in c.VAL_RECEPTACLE_OBJECTS.items()}
    carried = set().union(*holds.values())
    carried = {o for o in carried if not o.endswith("Sliced") and o not in _NOT_CARRIED}
    return {
        "holds": holds,
        "carried": frozenset(carried),
        "actions": {k: frozenset(v) for k, v in c.VAL_ACTION_OBJECTS.items()},
        "openable": frozenset(c.OPENABLE_CLASS_SET),
        "movable": frozenset(c.MOVABLE_RECEPTACLES),
        "train": tuple(c.TRAIN_SCENE_NUMBERS),
        "test": tuple(c.TEST_SCENE_NUMBERS),
        "max_instances": int(c.MAX_NUM_OF_OBJ_INSTANCES),
        "max_target_instances": int(c.PICKUP_REPEAT_MAX),
    }


class GenerationFailed(ValueError):
    """This attempt drew a scene/target combination that cannot pose the task."""


@dataclass
class GeneratedProblem:
    """One candidate game: the PDDL problem, the goal text and its ``traj_data`` fields."""

    pddl_problem: str
    goal_text: str
    traj_data: dict[str, Any]

    def game(self) -> dict[str, Any]:
        """The ``game.tw-pddl`` JSON (``solvable``/``walkthrough`` still unset)."""
        return {
            "pddl_domain": domain_text(),
            "grammar": grammar_text().replace("UNKNOWN GOAL", self.goal_text),
            "pddl_problem": self.pddl_problem,
            "solvable": None,
            "walkthrough": None,
        }


def scene_numbers(split: str, version: int = GENERATOR_VERSION) -> tuple[int, ...]:
    """The floor plans ``split`` draws from: version 3 holds ALFRED's ``valid_unseen`` rooms out
    of ``train``/``valid_seen`` and uses them for ``valid_unseen``; versions 1-2 use alfworld's
    ``TRAIN_SCENE_NUMBERS`` and ``TEST_SCENE_NUMBERS``."""
    t = _tables()
    if version >= 3:
        if split == "valid_unseen":
            return ALFRED_VALID_UNSEEN_SCENES
        return tuple(n for n in t["train"] if n not in ALFRED_VALID_UNSEEN_SCENES)
    return tuple(t["test"] if split == "valid_unseen" else t["train"])


def _lamp_hosts(lamp: str, version: int) -> tuple[str, ...]:
    return _LAMP_HOSTS[lamp] if version >= 3 else _LAMP_SURFACES


def _trim(
    objects: list, n_receptacles: int, minimum: dict[str, int], rng: random.Random, limit: int | None = None
) -> list:
    """Version 3: drop object copies until ``len(objects) * n_receptacles <= limit`` (default
    :data:`MAX_PROBLEM_SIZE`): first a copy of the most repeated class (a class in ``minimum``
    keeps that many), then, when every class is down to one copy, a whole class not in
    ``minimum``."""
    limit = MAX_PROBLEM_SIZE if limit is None else limit
    objects = list(objects)
    while len(objects) * n_receptacles > limit:
        counts: dict[str, int] = {}
        for _, cls, _ in objects:
            counts[cls] = counts.get(cls, 0) + 1
        spare = [c for c in sorted(counts) if counts[c] > minimum.get(c, 1)]
        if spare:
            victim = max(spare, key=counts.__getitem__)
        else:
            droppable = [c for c in sorted(counts) if c not in minimum]
            if not droppable:
                raise GenerationFailed(f"{len(objects)} objects x {n_receptacles} receptacles exceed MAX_PROBLEM_SIZE")
            victim = rng.choice(droppable)
        del objects[rng.choice([i for i, o in enumerate(objects) if o[1] == victim])]
    return objects


def _scenes_for(task_type: str, split: str, rng: random.Random, version: int) -> list[int]:
    numbers = list(scene_numbers(split, version))
    rng.shuffle(numbers)
    return numbers


def generate_problem(
    task_type: str, split: str, index: int, seed: int = 0, attempt: int = 0, version: int = GENERATOR_VERSION
) -> GeneratedProblem:
    """Draw game ``index`` of ``task_type`` for ``split`` with generator ``version``; raise
    :class:`GenerationFailed` when the drawn scene cannot pose the task (the caller moves on to
    ``attempt + 1``)."""
    if version not in GENERATOR_VERSIONS:
        raise ValueError(f"generator version must be one of {GENERATOR_VERSIONS}, got {version!r}")
    if task_type not in TASK_TYPES:
        raise ValueError(f"unknown task type {task_type!r}; expected one of {TASK_TYPES}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    rng = _rng(version, seed, split, task_type, index, attempt)
    t = _tables()
    scene = load_scene(_scenes_for(task_type, split, rng, version)[0])
    if version == 1:
        scene_receptacles = _thin(list(scene.receptacles), rng)
    elif version >= 3:
        scene_receptacles = _thin(list(scene.receptacles), rng, MAX_RECEPTACLES_V3)
    else:
        scene_receptacles = list(scene.receptacles)
    recep_classes = sorted({cls for _, cls, _ in scene_receptacles})
    carried = [cls for cls in scene.object_classes if cls in t["carried"]]
    lamps = [cls for cls in scene.object_classes if cls in _LAMPS]
    surfaces = [cls for cls in recep_classes if cls in _LAMP_SURFACES]
    if version >= 3:  # only lamps with somewhere to stand
        lamps = [cls for cls in lamps if any(r in _LAMP_HOSTS[cls] for r in recep_classes)]
        surfaces = lamps

    def can_hold(recep: str, obj: str) -> bool:
        return obj in t["holds"].get(recep, ())

    # ---- the task's targets ----
    toggle = ""
    if task_type == "look_at_obj_in_light":
        if not lamps or not surfaces:
            raise GenerationFailed(f"FloorPlan{scene.number} has no lamp on a table")
        toggle = rng.choice(lamps)
        obj_choices = [o for o in carried if any(can_hold(r, o) for r in recep_classes)]
        if not obj_choices:
            raise GenerationFailed("nothing to look at")
        obj, recep = rng.choice(obj_choices), ""
    else:
        appliance, skill = _APPLIANCE.get(task_type, (None, None))
        if appliance is not None and appliance not in recep_classes:
            raise GenerationFailed(f"FloorPlan{scene.number} has no {appliance}")
        pairs = [
            (o, r)
            for o in carried
            if skill is None or o in t["actions"][skill]
            for r in recep_classes
            if r != appliance and can_hold(r, o)
            # somewhere else to start from, so that the goal does not hold at the start
            and any(can_hold(r2, o) for r2 in recep_classes if r2 != r)
        ]
        if not pairs:
            raise GenerationFailed(f"FloorPlan{scene.number} has no target pair for {task_type}")
        obj, recep = rng.choice(pairs)

    # ---- receptacles, locations, agent ----
    receptacles = []  # (pddl id, class, location)
    used_locations = set()
    for thor_id, cls, point in scene_receptacles:
        x, z, rot, hor = point
        loc = _location(point)
        while loc in used_locations:  # two receptacles at one spot: step aside, one location each
            x += 0.25
            loc = _location((x, z, rot, hor))
        used_locations.add(loc)
        receptacles.append((_escape(thor_id), cls, _escape(loc)))
    used_locations = {_escape(loc) for loc in used_locations}
    while True:
        start = f"loc|{rng.randint(-12, 12)}|{rng.randint(-12, 12)}|{rng.randint(0, 3)}|30"
        if _escape(start) not in used_locations:
            break
    start = _escape(start)

    # ---- objects ----
    def instances(cls: str) -> int:
        if version == 1:
            if cls == obj and task_type == "pick_two_obj_and_place":
                return rng.choice((2, 2, 3))
            return rng.choice((1, 1, 1, 2, 2, 3))
        if cls == obj:
            return rng.randint(2 if task_type == "pick_two_obj_and_place" else 1, t["max_target_instances"])
        return rng.randint(1, t["max_instances"])

    objects = []  # (pddl id, class, receptacle pddl id)
    taken = set()
    for cls in carried + lamps:
        if cls in _LAMPS:
            if version == 1 and cls != toggle and rng.random() < 0.5:
                continue
            hosts = [r for r in receptacles if r[1] in _lamp_hosts(cls, version)]
            count = 1
        else:
            hosts = [r for r in receptacles if can_hold(r[1], cls) and not (cls == obj and r[1] == recep)]
            count = instances(cls)
        if not hosts:
            continue
        for _ in range(count):
            while True:
                coords = (rng.randint(-300, 300) / 100, rng.randint(0, 200) / 100, rng.randint(-300, 300) / 100)
                thor_id = f"{cls}|{coords[0]:+06.2f}|{coords[1]:+06.2f}|{coords[2]:+06.2f}"
                if thor_id not in taken:
                    taken.add(thor_id)
                    break
            host = rng.choice(hosts)
            objects.append((_escape(thor_id), cls, host[0]))
    if version >= 3:
        minimum = {obj: 2 if task_type == "pick_two_obj_and_place" else 1}
        if toggle:
            minimum[toggle] = 1
        objects = _trim(objects, len(receptacles), minimum, rng)
    if not any(cls == obj for _, cls, _ in objects):
        raise GenerationFailed(f"no place for a {obj} in FloorPlan{scene.number}")
    if toggle and not any(cls == toggle for _, cls, _ in objects):
        raise GenerationFailed(f"no place for the {toggle}")

    problem = _problem_text(f"gen_{task_type}_{split}_{seed}_{index}", receptacles, objects, start, t)
    goal_pddl = upstream()["goal_library"].gdict[task_type]["pddl"]
    goal_pddl = goal_pddl.format(obj=obj, recep=recep, toggle=toggle, mrecep="").replace("#", "-")
    problem = problem + goal_pddl.strip() + "\n"
    template = rng.choice(upstream()["goal_library"].gdict[task_type]["templates"])
    goal_text = template.format(obj=obj.lower(), recep=recep.lower(), toggle=toggle.lower(), mrecep="")
    traj_data = {
        "task_type": task_type,
        "task_id": f"gen_{seed}_{split}_{task_type}_{index:05d}",
        "pddl_params": {
            "object_target": obj,
            "parent_target": recep,
            "toggle_target": toggle,
            "mrecep_target": "",
            "object_sliced": False,
        },
        "scene": {"floor_plan": f"FloorPlan{scene.number}", "scene_num": scene.number, "room": scene.room},
        "turk_annotations": {"anns": [{"task_desc": goal_text[0].upper() + goal_text[1:] + "."}]},
        "generator": {"version": version, "seed": seed, "index": index, "attempt": attempt},
    }
    return GeneratedProblem(problem, goal_text, traj_data)


def _problem_text(
    name: str,
    receptacles: list[tuple[str, str, str]],
    objects: list[tuple[str, str, str]],
    start: str,
    t: dict[str, Any],
) -> str:
    rclasses = sorted({cls for _, cls, _ in receptacles})
    oclasses = sorted({cls for _, cls, _ in objects})
    locations = sorted({loc for _, _, loc in receptacles} | {start})
    decl = ["agent1 - agent"]
    decl += [f"{cls}Type - otype" for cls in oclasses]
    decl += [f"{cls}Type - rtype" for cls in rclasses]
    decl += [f"{oid} - object" for oid, _, _ in objects]
    decl += [f"{rid} - receptacle" for rid, _, _ in receptacles]
    decl += [f"{loc} - location" for loc in locations]
    init = ["(= (total-cost) 0)"]
    init += [f"(receptacleType {rid} {cls}Type)" for rid, cls, _ in receptacles]
    init += [f"(objectType {oid} {cls}Type)" for oid, cls, _ in objects]
    init += [
        f"(canContain {r}Type {o}Type)" for r in rclasses for o in oclasses if o in t["holds"].get(r, ())
    ]
    for oid, cls, _ in objects:
        if cls in _LAMPS:
            init.append(f"(toggleable {oid})")
            continue
        init.append(f"(pickupable {oid})")
        if cls in t["movable"]:
            init.append(f"(isReceptacleObject {oid})")
        for predicate, skill in (
            ("cleanable", "Cleanable"),
            ("heatable", "Heatable"),
            ("coolable", "Coolable"),
            ("sliceable", "Sliceable"),
        ):
            if cls in t["actions"][skill]:
                init.append(f"({predicate} {oid})")
    init += [f"(openable {rid})" for rid, cls, _ in receptacles if cls in t["openable"]]
    init.append(f"(atLocation agent1 {start})")
    where = {rid: loc for rid, _, loc in receptacles}
    init += [f"(inReceptacle {oid} {rid})" for oid, _, rid in objects]
    init += [f"(receptacleAtLocation {rid} {loc})" for rid, _, loc in receptacles]
    init += [f"(objectAtLocation {oid} {where[rid]})" for oid, _, rid in objects]
    lines = [f"(define (problem {name})", "(:domain alfred)", "(:objects"]
    lines += ["    " + d for d in decl]
    lines += ["    )", "(:init"]
    lines += ["    " + f for f in init]
    lines += ["    )", ""]
    return "\n".join(lines)
