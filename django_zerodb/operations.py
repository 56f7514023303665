"""Value adaptation and the few SQL-shaped hooks Django calls on every backend.

Values are stored as typed Python values (msgpack keeps date, datetime, Decimal, UUID,
time), so the adapters keep types instead of turning them into SQL literals. Datetimes
are stored naive in the connection's time zone when ``USE_TZ`` is on (UTC, or the
database's ``TIME_ZONE``, as SQLite does) so that they order and compare the same way in
indexes and in Python.
"""

from __future__ import annotations

import datetime
import decimal
from typing import Any

from django.conf import settings
from django.db.backends.base.operations import BaseDatabaseOperations
from django.db.backends.utils import format_number
from django.utils import timezone


class DatabaseOperations(BaseDatabaseOperations):
    compiler_module = "django_zerodb.compiler"
    cast_char_field_without_max_length = "text"
    explain_prefix = "EXPLAIN"

    def quote_name(self, name: str) -> str:
        if name.startswith('"') and name.endswith('"'):
            return name
        return f'"{name}"'

    def max_name_length(self) -> int:
        return 200

    def no_limit_value(self) -> None:
        return None

    def pk_default_value(self) -> str:
        return "NULL"

    # -- value adaptation --------------------------------------------------------------------

    def adapt_datefield_value(self, value: Any) -> Any:
        return value

    def adapt_datetimefield_value(self, value: Any) -> Any:
        if value is None or hasattr(value, "resolve_expression"):
            return value
        if timezone.is_aware(value):
            if not settings.USE_TZ:
                raise ValueError(
                    "The encrypted database backend does not support timezone-aware "
                    "datetimes when USE_TZ is False."
                )
            # Naive in the connection's zone: UTC, or the database's TIME_ZONE.
            value = timezone.make_naive(value, self.connection.timezone)
        return value

    def adapt_timefield_value(self, value: Any) -> Any:
        if value is None or hasattr(value, "resolve_expression"):
            return value
        if timezone.is_aware(value):
            raise ValueError(
                "The encrypted database backend does not support timezone-aware times."
            )
        return value

    def adapt_decimalfield_value(
        self, value: Any, max_digits: int | None = None, decimal_places: int | None = None
    ) -> Any:
        if value is None or hasattr(value, "resolve_expression"):
            return value
        return decimal.Decimal(format_number(value, max_digits, decimal_places))

    def adapt_ipaddressfield_value(self, value: Any) -> Any:
        return value or None

    def integer_field_range(self, internal_type: str) -> tuple[int, int]:
        # Integers are stored whole, whatever the field type: as on SQLite, every field
        # holds 64 bits. Django's lookups treat a value outside this range as matching
        # nothing, so the base class's 32-bit IntegerField range would hide stored values
        # (filter(n=2**40) found no row that has n = 2**40).
        if internal_type.startswith("Positive"):
            return (0, 2**63 - 1)
        return (-(2**63), 2**63 - 1)

    # -- converters (stored value -> Python value) -------------------------------------------

    def get_db_converters(self, expression: Any) -> list:
        converters = super().get_db_converters(expression)
        internal_type = expression.output_field.get_internal_type()
        if internal_type == "DateTimeField" and settings.USE_TZ:
            converters.append(self.convert_datetimefield_value)
        return converters

    def convert_datetimefield_value(self, value: Any, expression: Any, connection: Any) -> Any:
        if isinstance(value, datetime.datetime) and timezone.is_naive(value):
            value = timezone.make_aware(value, self.connection.timezone)
        return value

    # -- SQL-shaped hooks --------------------------------------------------------------------
    # Django compiles some expressions to SQL text for bookkeeping (ordering labels, group
    # by keys) even though nothing is executed; these return readable placeholders.

    def date_extract_sql(self, lookup_type, sql, params):
        return f"EXTRACT({lookup_type} FROM {sql})", params

    def date_trunc_sql(self, lookup_type, sql, params, tzname=None):
        return f"TRUNC({lookup_type}, {sql})", params

    def datetime_cast_date_sql(self, sql, params, tzname):
        return f"DATE({sql})", params

    def datetime_cast_time_sql(self, sql, params, tzname):
        return f"TIME({sql})", params

    def datetime_extract_sql(self, lookup_type, sql, params, tzname):
        return f"EXTRACT({lookup_type} FROM {sql})", params

    def datetime_trunc_sql(self, lookup_type, sql, params, tzname):
        return f"TRUNC({lookup_type}, {sql})", params

    def time_trunc_sql(self, lookup_type, sql, params, tzname=None):
        return f"TRUNC({lookup_type}, {sql})", params

    def time_extract_sql(self, lookup_type, sql, params):
        return f"EXTRACT({lookup_type} FROM {sql})", params

    def regex_lookup(self, lookup_type: str) -> str:
        return "%s REGEXP %s"

    def format_for_duration_arithmetic(self, sql: str) -> str:
        # Durations are stored as microseconds (no native type): DurationValue asks for
        # this while Django compiles a select list it never runs here.
        return f"INTERVAL({sql})"

    # -- flush (TransactionTestCase, ``manage.py flush``) ------------------------------------

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        """The "statements" are the table names: ``execute_sql_flush`` empties them."""
        return list(tables)

    def execute_sql_flush(self, sql_list: list[str]) -> None:
        from django_zerodb.schema import empty_tables

        empty_tables(self.connection, sql_list)
