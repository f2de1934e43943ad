"""Each namespace's monthly budget in USD, set by the operator, in ``<data-dir>/namespace-budgets.json``.

Once a namespace's sessions spent it in a calendar month (UTC), new tasks there are refused (402) until the month
ends or the operator raises it. What was spent is counted from usage as it is stored (``namespace_spend``), not from
this file. Kept like the other per-namespace settings (0600, written whole under a lock).
"""

from __future__ import annotations

import errno
import json
import math
from datetime import UTC, datetime
from pathlib import Path

from ._files import locked, write_private
from ._names import Namespace

BUDGETS_FILE = "namespace-budgets.json"
#: The largest monthly budget taken (USD): far above any real one, small enough to stay exact as JSON.
MAX_MONTHLY_USD = 1e12


class NamespaceBudgetError(ValueError):
    """The stored file or a budget to store cannot be used; the message says what to do."""


def check_monthly_usd(value: float) -> float:
    """``value`` if it may be a monthly budget (a finite number of USD, 0 or more), else ``NamespaceBudgetError``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value <= MAX_MONTHLY_USD:
        raise NamespaceBudgetError(f"a monthly budget is a number of USD from 0 to {MAX_MONTHLY_USD:g}, not {value!r}")
    return float(value)


def month_of(moment: datetime) -> str:
    """The calendar month (UTC) a moment falls in, as the store keys spend by: ``YYYY-MM``."""
    return moment.astimezone(UTC).strftime("%Y-%m")


def next_month_start(moment: datetime) -> datetime:
    """When the month of ``moment`` ends (UTC): the first instant of the next."""
    moment = moment.astimezone(UTC)
    year, month = (moment.year + 1, 1) if moment.month == 12 else (moment.year, moment.month + 1)
    return datetime(year, month, 1, tzinfo=UTC)


class NamespaceBudgets:
    """The per-namespace monthly budgets of one data dir."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / BUDGETS_FILE

    def all(self) -> dict[str, float]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):  # nothing wrong with the file: the process is short
                raise NamespaceBudgetError(f"{self.path} cannot be read now: the supervisor is out of file "
                                           f"descriptors ({exc}); retry once it holds fewer") from exc
            raise NamespaceBudgetError(f"{self.path} cannot be read ({exc}): fix or remove it") from exc
        except ValueError as exc:
            raise NamespaceBudgetError(f"{self.path} cannot be read ({exc}): fix or remove it") from exc
        if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
            raise NamespaceBudgetError(f"{self.path} is not a namespace budgets file: fix or remove it")
        try:
            return {name: check_monthly_usd(entry.get("monthly_usd")) for name, entry in raw.items()}
        except NamespaceBudgetError as exc:
            raise NamespaceBudgetError(f"{self.path}: {exc}: fix or remove it") from exc

    def get(self, namespace: str) -> float | None:
        """The namespace's monthly budget in USD; None when it has none."""
        return self.all().get(Namespace.parse(namespace).name)

    def set(self, namespace: str, monthly_usd: float | None) -> float | None:
        """Store the namespace's monthly budget (None: drop it); returns what is now stored."""
        name = Namespace.parse(namespace).name
        if monthly_usd is not None:
            monthly_usd = check_monthly_usd(monthly_usd)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with locked(self.path.with_suffix(".lock")):
            every = self.all()
            if monthly_usd is None:
                every.pop(name, None)
            else:
                every[name] = monthly_usd
            write_private(self.path, json.dumps({k: {"monthly_usd": v} for k, v in sorted(every.items())},
                                                indent=1) + "\n")
        return every.get(name)
