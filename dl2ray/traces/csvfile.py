"""Strict CSV reading for the importers: every problem names file, line and field.

Line numbers are physical lines of the file (the header is line 1). Blank
lines are skipped; any other row must have exactly as many fields as the
header. The header must contain every required column (extra columns are
allowed and ignored, in any order).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from dl2ray.traces import TraceError

Row = list[str]


class CsvRecords:
    """Rows of one CSV file, with the column positions of the required fields.

    Use as an iterator of ``(line, row)``; parse fields with :meth:`number`,
    :meth:`integer`, :meth:`text` and :meth:`datetime_s`, which raise
    :class:`TraceError` naming ``path:line`` and the field.
    """

    def __init__(self, path: str | Path, required: tuple[str, ...]) -> None:
        self.path = Path(path)
        self.required = required
        self.columns: dict[str, int] = {}
        self.header: list[str] = []

    def __iter__(self) -> Iterator[tuple[int, Row]]:
        try:
            with open(self.path, encoding="utf-8-sig", newline="") as fh:
                reader = csv.reader(fh)
                yield from self._rows(reader)
        except OSError as exc:
            raise TraceError(f"{self.path}: cannot read trace: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise TraceError(f"{self.path}: not UTF-8 text: {exc.reason}") from None

    def _rows(self, reader: Iterator[Row]) -> Iterator[tuple[int, Row]]:
        try:
            self._header(next(reader, None))
            for row in reader:
                if not row:
                    continue
                line = reader.line_num  # type: ignore[attr-defined]
                if len(row) != len(self.header):
                    self._wrong_width(line, row)
                yield line, row
        except csv.Error as exc:
            line = reader.line_num  # type: ignore[attr-defined]
            raise TraceError(f"{self.path}:{line}: malformed CSV: {exc}") from None

    def _header(self, header: Row | None) -> None:
        if header is None:
            raise TraceError(f"{self.path}:1: empty file, expected a header")
        names = [h.strip() for h in header]
        missing = [c for c in self.required if c not in names]
        if missing:
            raise TraceError(
                f"{self.path}:1: header lacks column(s) {missing}; "
                f"expected {','.join(self.required)}"
            )
        self.columns = {c: names.index(c) for c in self.required}
        self.header = names

    def _wrong_width(self, line: int, row: Row) -> None:
        width = len(self.header)
        if len(row) < width:
            raise TraceError(
                f"{self.path}:{line}: field {self.header[len(row)]!r}: missing "
                f"({len(row)} fields, expected {width})"
            )
        raise TraceError(
            f"{self.path}:{line}: {len(row)} fields, expected {width} ({','.join(self.header)})"
        )

    # -- field parsers ---------------------------------------------------------------

    def text(self, line: int, row: Row, field: str) -> str:
        return row[self.columns[field]].strip()

    def _fail(self, line: int, field: str, value: str, what: str) -> TraceError:
        return TraceError(f"{self.path}:{line}: field {field!r}: cannot parse {value!r} as {what}")

    def number(self, line: int, row: Row, field: str, *, empty: float | None = None) -> float:
        """A finite number; an empty field returns ``empty`` when it is given."""
        value = self.text(line, row, field)
        if not value and empty is not None:
            return empty
        try:
            out = float(value)
        except ValueError:
            raise self._fail(line, field, value, "a number") from None
        if not math.isfinite(out):
            raise self._fail(line, field, value, "a finite number")
        return out

    def integer(self, line: int, row: Row, field: str) -> int:
        """An integer; ``"2.0"`` is accepted, ``"2.5"`` is not."""
        value = self.text(line, row, field)
        try:
            return int(value)
        except ValueError:
            pass
        try:
            out = float(value)
        except ValueError:
            raise self._fail(line, field, value, "an integer") from None
        if not out.is_integer():
            raise self._fail(line, field, value, "an integer")
        return int(out)

    def datetime_s(self, line: int, row: Row, field: str) -> float:
        """``YYYY-MM-DD HH:MM:SS`` (read as UTC) → seconds since the Unix epoch."""
        value = self.text(line, row, field)
        try:
            if len(value) != 19 or value[10] != " ":
                raise ValueError
            stamp = datetime.fromisoformat(value)
        except ValueError:
            raise self._fail(line, field, value, "a date 'YYYY-MM-DD HH:MM:SS'") from None
        return stamp.replace(tzinfo=UTC).timestamp()

    def time_s(self, line: int, row: Row, field: str) -> float:
        """Seconds, given either as a number or as a ``YYYY-MM-DD HH:MM:SS`` date."""
        value = self.text(line, row, field)
        if len(value) == 19 and value[4] == "-":
            return self.datetime_s(line, row, field)
        return self.number(line, row, field)
