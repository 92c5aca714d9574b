"""Student's t quantile of the 95 % intervals over seeds: ``t_{0.975, df}``, tabulated.

The comparisons over seeds (:mod:`posenc.experiments.comparisons`) ask for one quantile
only, the two-sided 95 % one. For ``df`` 1 to 100 it is read from :data:`T_975`, SciPy's
``scipy.stats.t.ppf(0.975, df)`` (SciPy 1.17) written out to every digit a float holds;
past 100 it is Fisher and Cornish's expansion in ``1 / df`` about the normal quantile
(Abramowitz and Stegun 26.7.5 and its next term), within 1e-12 of SciPy there (6e-13 at
``df = 101``, 2e-16 from ``df = 300`` on). ``tests/experiments/test_student_t.py`` holds
both to SciPy.
"""

from __future__ import annotations

import math

from posenc._errors import PosEncError

__all__ = ["MAX_DF", "T_975", "t_quantile"]

MAX_DF = 10**15  # past this t is the normal to every digit a float holds

#: ``t_{0.975, df}`` for ``df`` = 1, 2, ..., 100 (``T_975[df - 1]``).
# fmt: off
T_975: tuple[float, ...] = (
    12.706204736174694, 4.302652729749462, 3.1824463052837078, 2.7764451051977934,
    2.5705818356363146, 2.4469118511449786, 2.364624251592784, 2.306004135204166,
    2.262157162798205, 2.228138851986274, 2.200985160091639, 2.1788128296672284,
    2.1603686564627913, 2.144786687917804, 2.131449545559776, 2.1199052992212546,
    2.1098155778333156, 2.1009220402410382, 2.0930240544083087, 2.085963447265864,
    2.0796138447276795, 2.0738730679040254, 2.0686576104190486, 2.0638985616280245,
    2.0595385527532972, 2.0555294386428735, 2.0518305164802846, 2.0484071417952454,
    2.045229642132703, 2.0422724563012378, 2.039513446396408, 2.0369333434601016,
    2.0345152974493383, 2.0322445093177186, 2.030107928250343, 2.0280940009804502,
    2.0261924630291093, 2.0243941639119694, 2.022690920036761, 2.021075390306273,
    2.019540970441376, 2.0180817028184443, 2.016692199227824, 2.0153675744437636,
    2.014103388880846, 2.012895598919429, 2.0117405137297655, 2.010634757624232,
    2.0095752371292392, 2.008559112100761, 2.007583770315836, 2.006646805061688,
    2.0057459953178687, 2.0048792881880564, 2.0040447832891455, 2.003240718847872,
    2.002465459291007, 2.0017174841452356, 2.000995378088267, 2.0002978220142604,
    1.999623584994939, 1.9989715170333788, 1.998340542520741, 1.997729654317693,
    1.9971379083920038, 1.9965644189523117, 1.996008354025296, 1.9954689314298435,
    1.9949454151072374, 1.994437111771186, 1.9939433678456255, 1.9934635666618719,
    1.992997125889855, 1.992543495180932, 1.9921021540022417, 1.9916726096446642,
    1.9912543953883846, 1.9908470688116906, 1.9904502102301285, 1.990063421254446,
    1.9896863234569029, 1.989318557136572, 1.9889597801751624, 1.9886096669757083,
    1.9882679074772216, 1.98793420623902, 1.9876082815890708, 1.9872898648311692,
    1.986978699506281, 1.9866745407037683, 1.9863771544186177, 1.98608631695113,
    1.9858018143458227, 1.985523441866604, 1.9852510035054978, 1.984984311522457,
    1.9847231860139845, 1.9844674545084815, 1.9842169515864174, 1.9839715185235518,
)
# fmt: on

#: The normal quantile ``z_{0.975}`` (``scipy.stats.norm.ppf(0.975)``).
_Z = 1.959963984540054

#: The coefficients ``g_k(z)`` of ``t = z + g_1 / df + g_2 / df^2 + ...``.
_G = (
    _Z,
    (_Z**3 + _Z) / 4,
    (5 * _Z**5 + 16 * _Z**3 + 3 * _Z) / 96,
    (3 * _Z**7 + 19 * _Z**5 + 17 * _Z**3 - 15 * _Z) / 384,
    (79 * _Z**9 + 776 * _Z**7 + 1482 * _Z**5 - 1920 * _Z**3 - 945 * _Z) / 92160,
    (27 * _Z**11 + 339 * _Z**9 + 930 * _Z**7 - 1782 * _Z**5 - 765 * _Z**3 + 17955 * _Z) / 368640,
)


def t_quantile(p: float, df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom: the half-width, in
    standard errors, of a two-sided 95 % interval.

    Raises:
        PosEncError: ``p`` other than 0.975 (the one quantile tabulated), or ``df`` not an
            integer in ``[1, MAX_DF]``.

    Examples:
        >>> round(t_quantile(0.975, 2), 3), round(t_quantile(0.975, 4), 3)
        (4.303, 2.776)
    """
    if not isinstance(p, (int, float)) or isinstance(p, bool) or p != 0.975:
        raise PosEncError(
            f"p must be 0.975 (the two-sided 95% interval, the one quantile tabulated), "
            f"got {p!r:.80}"
        )
    if not isinstance(df, int) or isinstance(df, bool) or not 1 <= df <= MAX_DF:
        raise PosEncError(f"df must be an integer in [1, {MAX_DF}], got {df!r:.80}")
    if df <= len(T_975):
        return T_975[df - 1]
    inverse = 1.0 / df
    return math.fsum(g * inverse**k for k, g in enumerate(_G))
