"""Tests of significance on numpy alone: t and F distributions, paired t-test, power, Holm, ANOVA.

Student's t (distribution function and quantiles), Snedecor's F, the 95% t-interval, the paired
t-test's p-value and power, the minimal detectable effect, Holm's adjustment of a family of
p-values and the one-way F-test across groups (docs/main-job.md, "Statistics" and "Tuning";
docs/regime.md, "Method").

Kept apart from :mod:`bpo_experiments.stats` (the main job's results, which read the presets)
so that the tuning protocol, which the presets hold, can test its candidates.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def t_cdf(x: float, dof: int) -> float:
    """Student's t distribution function (the regularised incomplete beta, by its continued
    fraction)."""
    if dof < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {dof}")
    if x == 0:
        return 0.5
    z = dof / (dof + x * x)
    tail = 0.5 * _betainc(dof / 2.0, 0.5, z)
    return 1.0 - tail if x > 0 else tail


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta ``I_x(a, b)`` (Lentz's continued fraction)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _betainc(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    f, c, d = 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        if i == 0:
            numerator = 1.0
        elif i % 2 == 0:
            numerator = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            numerator = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + numerator * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + numerator / c
        c = c if abs(c) > tiny else tiny
        f *= c * d
        if abs(1.0 - c * d) < 1e-14:
            break
    return front * (f - 1.0)


@functools.lru_cache(maxsize=1024)
def t_quantile(p: float, dof: int) -> float:
    """The ``p`` quantile of Student's t with ``dof`` degrees of freedom (bisection on
    :func:`t_cdf`)."""
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got {p}")
    lo, hi = -1e3, 1e3
    for _ in range(70):  # 2000 / 2^70: far below a double's resolution of the answer
        mid = (lo + hi) / 2
        if t_cdf(mid, dof) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def t975(dof: int) -> float:
    """The 0.975 quantile of Student's t with ``dof`` degrees of freedom."""
    return t_quantile(0.975, dof)


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of a 95% t-interval over seeds (0 for one seed)."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return float(x.mean()), 0.0
    return float(x.mean()), float(t975(len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))


def minimal_detectable_effect(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """``(t_{1 - alpha/2, n-1} + t_{power, n-1}) sd / sqrt(n)``: the true mean difference a
    two-sided level-``alpha`` paired t-test over ``n`` pairs with spread ``sd`` detects with
    probability ``power`` (nan for fewer than 2 pairs)."""
    if n < 2:
        return float("nan")
    return float((t_quantile(1 - alpha / 2, n - 1) + t_quantile(power, n - 1)) * sd / math.sqrt(n))


def power(effect: float, sd: float, n: int, alpha: float = 0.05) -> float:
    """The probability that a two-sided level-``alpha`` paired t-test over ``n`` pairs with
    spread ``sd`` detects a true mean difference ``effect``: under it the statistic is noncentral
    t, ``T = (Z + d) / S`` with ``d = |effect| sqrt(n) / sd``, ``Z`` standard normal and ``S^2``
    a chi-square over its ``n - 1`` degrees of freedom, so the power is
    ``E_S[1 - Phi(c S - d) + Phi(-c S - d)]`` with ``c = t_{1-alpha/2, n-1}``, integrated over
    ``U = sqrt(n - 1) S`` (density ``u^(k-1) e^(-u^2/2) / (2^(k/2-1) Gamma(k/2))``, ``k = n - 1``)
    by the trapezoid rule. nan for fewer than 2 pairs or no spread."""
    if n < 2 or not sd > 0:
        return float("nan")
    k = n - 1
    crit = t_quantile(1 - alpha / 2, k)
    shift = abs(effect) * math.sqrt(n) / sd
    u = np.linspace(0.0, math.sqrt(k) + 12.0, 4001)
    log_u = np.log(u, out=np.full_like(u, -np.inf), where=u > 0)
    power_term = (k - 1) * log_u if k > 1 else np.zeros_like(u)  # u^0 = 1, also at u = 0
    density = np.exp(power_term - u * u / 2 - (k / 2 - 1) * math.log(2) - math.lgamma(k / 2))
    scale = u / math.sqrt(k)
    phi = np.vectorize(lambda x: 0.5 * math.erfc(-x / math.sqrt(2)))
    reject = 1.0 - phi(crit * scale - shift) + phi(-crit * scale - shift)
    return float(np.clip(np.trapezoid(density * reject, u), 0.0, 1.0))


def paired_p_value(diffs: Sequence[float]) -> float | None:
    """Two-sided p-value of the paired t-test of ``mean(d) = 0``: ``2 (1 - F_t(|t|, n-1))`` with
    ``t = mean(d) / (sd(d) / sqrt(n))`` (None for fewer than 2 pairs; with no spread, 0 when the
    mean is not 0, else 1)."""
    d = np.asarray(diffs, dtype=float)
    n = len(d)
    if n < 2:
        return None
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    if sd == 0:
        return 0.0 if mean != 0 else 1.0
    t = mean / (sd / math.sqrt(n))
    return float(min(1.0, 2.0 * (1.0 - t_cdf(abs(t), n - 1))))


def welch_p_value(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided p-value of Welch's test of ``mean(a) = mean(b)`` (independent samples, unequal
    variances): ``t = (mean a - mean b) / se`` with ``se^2 = s_a^2 / n_a + s_b^2 / n_b``, against
    Student's t with the Welch-Satterthwaite degrees of freedom
    ``se^4 / ((s_a^2 / n_a)^2 / (n_a - 1) + (s_b^2 / n_b)^2 / (n_b - 1))`` (None for fewer than
    2 values on a side; with no spread, 0 when the means differ, else 1)."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(x) < 2 or len(y) < 2:
        return None
    va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    gap = float(x.mean() - y.mean())
    if va + vb == 0:
        return 0.0 if gap != 0 else 1.0
    dof = (va + vb) ** 2 / (va**2 / (len(x) - 1) + vb**2 / (len(y) - 1))
    return float(min(1.0, 2.0 * (1.0 - t_cdf(abs(gap) / math.sqrt(va + vb), dof))))


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of a family of ``m`` p-values (None: no test, left None and not
    counted in ``m``): sorted ascending ``p_(1) <= ... <= p_(m)``, the adjusted
    ``p~_(i) = max_{j <= i} min(1, (m - j + 1) p_(j))``, returned in the input's order. Rejecting
    where ``p~ < alpha`` keeps the family-wise error rate at ``alpha``."""
    tested = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    m = len(tested)
    out: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - rank) * float(p)))
        out[i] = running
    return out


def f_survival(x: float, dof_between: int, dof_within: int) -> float:
    """``P(F > x)`` for Snedecor's F with ``(dof_between, dof_within)`` degrees of freedom:
    ``I_{d2 / (d2 + d1 x)}(d2 / 2, d1 / 2)``."""
    if dof_between < 1 or dof_within < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {dof_between}, {dof_within}")
    if x <= 0:
        return 1.0
    return float(_betainc(dof_within / 2.0, dof_between / 2.0, dof_within / (dof_within + dof_between * x)))


def one_way_anova(groups: Sequence[Sequence[float]], alpha: float = 0.05, power: float = 0.8) -> dict[str, Any]:
    """The one-way F-test that ``k`` groups (here: tuning candidates, each scored on its seeds)
    share one mean, and the smallest difference of two group means it could detect.

    ``F = (SSB / (k - 1)) / (SSW / (N - k))`` with ``SSB = sum_i n_i (mean_i - mean)^2``,
    ``SSW = sum_i sum_j (x_ij - mean_i)^2``; ``p = P(F_{k-1, N-k} > F)``. ``detectable_difference``
    = ``(t_{1 - alpha/2, N-k} + t_{power, N-k}) sqrt(MSW (1/n_a + 1/n_b))`` for the two smallest
    groups: the difference of two candidates' means a level-``alpha`` comparison of those two
    detects with probability ``power``. ``distinguishable``: ``p < alpha``. With fewer than two
    groups or no replicate within a group (``N - k = 0``) nothing is testable: ``p`` and
    ``detectable_difference`` are None and ``distinguishable`` is False (and with no spread
    within the groups ``F`` is None, ``p`` 0 when the means differ, else 1)."""
    data = [np.asarray(g, dtype=float) for g in groups]
    k, total = len(data), sum(len(g) for g in data)
    dof_b, dof_w = k - 1, total - k
    means = [float(g.mean()) for g in data if len(g)]
    out: dict[str, Any] = {"test": "one-way F-test", "groups": k, "observations": total, "dof": [dof_b, dof_w],
                           "F": None, "p": None, "alpha": alpha, "power": power, "detectable_difference": None,
                           "spread": float(max(means) - min(means)) if means else None, "distinguishable": False}
    if k < 2 or dof_w < 1 or any(len(g) == 0 for g in data):
        return out
    grand = float(np.concatenate(data).mean())
    ssb = float(sum(len(g) * (g.mean() - grand) ** 2 for g in data))
    ssw = float(sum(((g - g.mean()) ** 2).sum() for g in data))
    msw = ssw / dof_w
    if msw == 0:
        f, p = None, (0.0 if ssb > 0 else 1.0)  # no spread within: F is infinite or undefined
    else:
        f = (ssb / dof_b) / msw
        p = f_survival(f, dof_b, dof_w)
    sizes = sorted(len(g) for g in data)[:2]
    detectable = (t_quantile(1 - alpha / 2, dof_w) + t_quantile(power, dof_w)) * math.sqrt(msw * (1 / sizes[0] + 1 / sizes[1]))
    out.update({"F": f, "p": p, "msw": msw, "detectable_difference": float(detectable), "distinguishable": bool(p < alpha)})
    return out


def against_default(groups: Sequence[Sequence[float]], default: int, alpha: float = 0.05,
                    anova: dict[str, Any] | None = None) -> dict[str, Any]:
    """Each group against group ``default`` (many-to-one comparisons, as Dunnett's), on the
    one-way ANOVA's pooled within-group variance: ``t_i = (mean_i - mean_d) / sqrt(MSW (1/n_i +
    1/n_d))`` on ``N - k`` degrees of freedom, two-sided ``p_i``, Holm-adjusted over the ``k - 1``
    comparisons (``p_holm``). ``better``: the indices whose ``p_holm < alpha`` with a mean above
    the default's. The F-test answers whether *any* groups differ (one clearly bad candidate is
    enough); this answers whether any beats the default. With nothing testable (no replicate
    within a group, or no spread within and equal means) ``p`` is None and nothing is better.
    ``anova``: :func:`one_way_anova` of ``groups`` when the caller has it already."""
    data = [np.asarray(g, dtype=float) for g in groups]
    test = anova if anova is not None else one_way_anova(groups, alpha=alpha)
    msw, dof = test.get("msw"), test["dof"][1]
    means = [float(g.mean()) for g in data]
    rows: list[dict[str, Any]] = []
    for i, g in enumerate(data):
        if i == default:
            continue
        diff = means[i] - means[default]
        if msw is None:
            p = None
        elif msw == 0:
            p = 0.0 if diff != 0 else 1.0
        else:
            t = diff / math.sqrt(msw * (1 / len(g) + 1 / len(data[default])))
            p = float(min(1.0, 2.0 * (1.0 - t_cdf(abs(t), dof))))
        rows.append({"index": i, "diff": diff, "p": p})
    for row, adjusted in zip(rows, holm([r["p"] for r in rows]), strict=True):
        row["p_holm"] = adjusted
        row["better"] = bool(adjusted is not None and adjusted < alpha and row["diff"] > 0)
    return {"test": "many-to-one t-tests on the pooled variance, Holm-adjusted", "default": default,
            "dof": dof, "alpha": alpha, "comparisons": rows, "better": [r["index"] for r in rows if r["better"]]}


def choose_candidate(groups: Sequence[Sequence[float]], default: int | None, alpha: float = 0.05) -> dict[str, Any]:
    """A tuning's decision from each candidate's scores over the tuning seeds (``groups``), the
    main job's and the regime map's (docs/main-job.md, "Tuning"):

    * ``f_test``: :func:`one_way_anova` across the candidates (with the smallest difference of
      two candidates it detects: the power the tuning had);
    * where the defaults are a candidate (``default``, an index): ``vs_default``
      (:func:`against_default`); ``chosen`` is the highest mean among the candidates that beat
      the defaults detectably, else ``default`` (``kept_default``). Switching on the F-test
      instead picks the highest of near-equal leaders whenever one candidate is clearly worse,
      a different one on every run;
    * where they are not (``default`` None): the F-test decides; ``chosen`` is the highest mean
      when it rejects, else None (the caller keeps its defaults).

    ``best``: the highest mean either way (the first on a tie); ``distinguishable``: whether the
    tuning told a candidate apart from what it keeps."""
    means = [float(np.mean(g)) for g in groups]
    best = int(np.argmax(means))
    test = one_way_anova(groups, alpha=alpha)
    if default is None:
        told = bool(test["distinguishable"])
        return {"f_test": test, "vs_default": None, "best": best, "chosen": best if told else None,
                "kept_default": not told, "distinguishable": told}
    versus = against_default(groups, default, alpha, anova=test)
    told = bool(versus["better"])
    chosen = max(versus["better"], key=lambda i: means[i]) if told else default
    return {"f_test": test, "vs_default": versus, "best": best, "chosen": chosen, "kept_default": not told,
            "distinguishable": told}
