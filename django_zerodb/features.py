"""What the encrypted store can and cannot do, as Django's feature flags.

Flags decide which code paths Django takes: things set False here make Django either
avoid a feature or raise ``NotSupportedError`` itself before a query is built.
"""

from __future__ import annotations

from django.db.backends.base.features import BaseDatabaseFeatures

from django_zerodb import compat
from django_zerodb.expected_failures import expected_failures


class DatabaseFeatures(BaseDatabaseFeatures):
    minimum_database_version = None
    # Transactions are client-side snapshots committed atomically; savepoints are O(1).
    supports_transactions = True
    uses_savepoints = True
    can_release_savepoints = True
    atomic_transactions = True
    autocommits_when_autocommit_is_off = False
    supports_atomic_references_rename = True
    can_rollback_ddl = True
    # Inserts return their new primary keys (allocated by the store's id blocks).
    can_return_columns_from_insert = True
    can_return_rows_from_bulk_insert = True
    can_return_rows_from_update = False
    has_bulk_insert = True
    supports_ignore_conflicts = False
    supports_update_conflicts = False
    supports_update_conflicts_with_target = False
    # Values are stored as typed Python values (msgpack), not as SQL types.
    has_native_uuid_field = True
    # UUID4()/UUID7(shift) are made in Python per row (functions.py), where Django has them.
    supports_uuid4_function = compat.UUID4 is not None
    supports_uuid7_function = compat.UUID7 is not None
    supports_uuid7_function_shift = compat.UUID7 is not None
    has_native_duration_field = False
    supports_timezones = False
    has_zoneinfo_database = True
    # JSON is stored as its text (as on SQLite); key lookups are evaluated on it
    # (jsonvalues.py), containment is refused; JSONArray/JSONObject build it (functions.py).
    supports_json_field = True
    supports_primitives_in_json_field = True
    has_native_json_field = False
    supports_json_field_contains = False
    has_json_object_function = True
    allows_auto_pk_0 = True
    supports_unspecified_pk = False
    interprets_empty_strings_as_nulls = False
    supports_forward_references = True
    # No SQL: no raw queries, no DISTINCT ON. Window functions run on the query's rows
    # (windows.py). Set operations run on
    # the parts' rows (combined.py); a part may not be ordered or sliced, as on SQLite.
    supports_select_union = True
    supports_select_intersection = True
    supports_select_difference = True
    supports_slicing_ordering_in_compound = False
    can_distinct_on_fields = True
    supports_over_clause = True
    supports_frame_range_fixed_distance = True
    supports_aggregate_filter_clause = True
    # StringAgg(..., order_by=...): the group's rows are sorted first (query.py).
    supports_aggregate_order_by_clause = True
    supports_subqueries_in_group_by = False
    supports_select_for_update_with_limit = True
    has_select_for_update = True
    has_select_for_update_nowait = False
    has_select_for_update_skip_locked = False
    has_select_for_update_of = False
    has_select_for_no_key_update = False
    supports_explaining_query_execution = True
    supports_comments = False
    supports_comments_inline = False
    # Computed by the backend on every write of the row (generated.py).
    supports_stored_generated_columns = True
    supports_virtual_generated_columns = True
    # Checked by the backend on every write (constraints.py), as SQLite's CHECK clauses.
    supports_table_check_constraints = True
    supports_column_check_constraints = True
    can_introspect_check_constraints = False
    # Kept as derived columns of the records (derived.py).
    supports_expression_indexes = True
    supports_partial_indexes = True
    supports_functions_in_partial_indexes = True
    supports_covering_indexes = False
    supports_deferrable_unique_constraints = False
    supports_index_on_text_field = True
    supports_foreign_keys = False
    supports_on_delete_db_cascade = False
    supports_on_delete_db_default = False
    supports_on_delete_db_null = False
    can_create_inline_fk = False
    supports_sequence_reset = False
    can_introspect_foreign_keys = False
    can_introspect_default = False
    connection_persists_old_columns = False
    introspected_field_types: dict = {}
    supports_paramstyle_pyformat = False
    requires_literal_defaults = False
    supports_default_keyword_in_insert = False
    supports_default_keyword_in_bulk_insert = False
    test_db_allows_multiple_connections = True
    supports_temporal_subtraction = True
    supports_expression_defaults = False
    supports_boolean_expr_in_select_clause = True
    supports_collation_on_charfield = False
    supports_collation_on_textfield = False
    supports_non_deterministic_collations = False
    supports_unlimited_charfield = True
    supports_no_precision_decimalfield = True
    supports_tablespaces = False
    can_defer_constraint_checks = False
    supports_partially_nullable_unique_constraints = True
    supports_nulls_distinct_unique_constraints = False
    ignores_table_name_case = False
    order_by_nulls_first = True
    nulls_order_largest = False
    greatest_least_ignores_nulls = False
    supports_logical_xor = True
    # What Django's own test suite may skip or expect to fail here (from `make
    # conformance`; see docs/conformance.md): expected failures are declared by category,
    # with their reasons, in expected_failures.py. A listed test still counts as not passing.
    django_test_skips: dict[str, set[str]] = {}
    django_test_expected_failures: set[str] = expected_failures()
