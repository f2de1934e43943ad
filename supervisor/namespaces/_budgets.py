"""Each namespace's monthly budget in USD, set by the operator, in ``<data-dir>/namespace-budgets.json``.

Once a namespace's sessions spent it in a calendar month (UTC), new tasks there are refused (402) until the month
ends or the operator raises it. What was spent is counted from usage as it is stored (``namespace_spend``), not from
this file. Kept like the other per-namespace settings (0600, written whole under a lock).
"""

from __future__ import annotations

import errno
import math
from datetime import UTC, datetime
from pathlib import Path

from ._limits import JsonLimitFile, LimitTable, LimitTableUnreadable
from ._pg_errors import NamespaceStateUnavailable
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
    """The per-namespace monthly budgets: of one data dir, or of ``table`` (``LimitTable``: the shared database)."""

    def __init__(self, data_dir: Path, table: LimitTable | None = None) -> None:
        self.path = Path(data_dir) / BUDGETS_FILE
        self.table: LimitTable = table if table is not None else JsonLimitFile(self.path)

    def all(self) -> dict[str, float]:
        where = self.table.location
        try:
            raw = self.table.load()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):  # nothing wrong with the file: the process is short
                raise NamespaceBudgetError(f"{where} cannot be read now: the supervisor is out of file "
                                           f"descriptors ({exc}); retry once it holds fewer") from exc
            raise NamespaceBudgetError(f"{where} cannot be read ({exc}): fix or remove it") from exc
        except (ValueError, LimitTableUnreadable, NamespaceStateUnavailable) as exc:
            raise NamespaceBudgetError(f"{where} cannot be read ({exc}): fix or remove it") from exc
        if not all(isinstance(v, dict) for v in raw.values()):
            raise NamespaceBudgetError(f"{where} is not a namespace budgets file: fix or remove it")
        try:
            return {name: check_monthly_usd(entry.get("monthly_usd")) for name, entry in raw.items()}
        except NamespaceBudgetError as exc:
            raise NamespaceBudgetError(f"{where}: {exc}: fix or remove it") from exc

    def get(self, namespace: str) -> float | None:
        """The namespace's monthly budget in USD; None when it has none."""
        return self.all().get(Namespace.parse(namespace).name)

    def set(self, namespace: str, monthly_usd: float | None) -> float | None:
        """Store the namespace's monthly budget (None: drop it); returns what is now stored."""
        name = Namespace.parse(namespace).name
        if monthly_usd is not None:
            monthly_usd = check_monthly_usd(monthly_usd)
        try:
            self.table.store(name, None if monthly_usd is None else {"monthly_usd": monthly_usd})
        except (LimitTableUnreadable, NamespaceStateUnavailable) as exc:
            raise NamespaceBudgetError(f"{self.table.location} cannot be written ({exc})") from exc
        return monthly_usd
