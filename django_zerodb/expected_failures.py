"""The tests of Django's own suite this backend expects to fail, and why.

Only tests whose failing assertion is not about data may be listed: the SQL text or
parameters a query compiles to (this backend runs no SQL; ``connection.queries`` holds
engine plans), how many queries a statement takes, or connection internals (how a lock
waits). A test that gets a wrong answer is a bug to fix, and one this backend refuses
(``NotSupportedError``) fails loudly on its own; neither is listed. Each group declares
its category; ``tests/django/test_expected_failures.py`` checks the groups against the
categories, and ``DatabaseFeatures.django_test_expected_failures`` is their union.
"""

from __future__ import annotations

from dataclasses import dataclass

# The only kinds of assertion an expected failure may fail on.
CATEGORIES = {
    "sql_text": "asserts on the SQL text or parameters of a query",
    "query_count": "asserts on the number of queries a statement takes",
    "connection_internals": "asserts on how a connection waits for another one",
}


@dataclass(frozen=True)
class ExpectedFailures:
    """Tests (``app.module.Class.test_method``) failing for one reason of one category."""

    category: str
    reason: str
    tests: frozenset[str]


GROUPS: tuple[ExpectedFailures, ...] = (
    ExpectedFailures(
        "connection_internals",
        "select_for_update() is optimistic here: it never blocks another transaction (the "
        "tests time how long one waits); a commit whose rows changed since they were read "
        "fails with SerializationError instead",
        frozenset(
            {
                "get_or_create.tests.UpdateOrCreateTransactionTests.test_creation_in_transaction",
                "get_or_create.tests.UpdateOrCreateTransactionTests.test_updates_in_transaction",
            }
        ),
    ),
    ExpectedFailures(
        "sql_text",
        "asserts on SQL text or SQL parameters; this backend runs no SQL (connection.queries "
        "holds engine plans)",
        frozenset(
            {
                "admin_changelist.tests.ChangeListTests"
                ".test_changelist_view_list_editable_changed_objects_uses_filter",
                "admin_changelist.tests.ChangeListTests.test_many_search_terms",
                "basic.tests.ModelRefreshTests.test_refresh_for_update",
                "delete.tests.DeletionTests.test_only_referenced_fields_selected",
                "get_or_create.tests.UpdateOrCreateTests"
                ".test_update_only_defaults_and_pre_save_fields_when_local_fields",
                "lookup.tests.LookupTests.test_exact_booleanfield",
                "lookup.tests.LookupTests.test_exact_booleanfield_annotation",
                "lookup.tests.LookupTests.test_in_ignore_none",
                "lookup.tests.LookupTests.test_in_ignore_none_with_unhashable_items",
                "lookup.tests.LookupTests.test_in_keeps_value_ordering",
                "lookup.tests.LookupTests.test_lookup_direct_value_rhs_unwrapped",
                "lookup.tests.LookupTests.test_textfield_exact_null",
                "model_fields.test_jsonfield.TestQuerying.test_key_sql_injection_escape",
                "model_forms.tests.ModelMultipleChoiceFieldTests"
                ".test_clean_does_deduplicate_values",
                "prefetch_related.tests.MultiTableInheritanceTest.test_child_link_prefetch",
                "prefetch_related.tests.PrefetchRelatedTests.test_m2m_then_m2m_object_ids",
                "prefetch_related.tests.PrefetchRelatedTests.test_m2m_then_reverse_fk_object_ids",
                "prefetch_related.tests.PrefetchRelatedTests"
                ".test_m2m_then_reverse_one_to_one_object_ids",
                "queries.tests.ExcludeTests.test_exclude_m2m_through",
                "aggregation.tests.AggregateAnnotationPruningTests"
                ".test_referenced_aggregate_annotation_kept",
                "aggregation.tests.AggregateAnnotationPruningTests"
                ".test_referenced_composed_subquery_requires_wrapping",
                "aggregation.tests.AggregateAnnotationPruningTests"
                ".test_referenced_subquery_requires_wrapping",
                "aggregation.tests.AggregateAnnotationPruningTests"
                ".test_unreferenced_aggregate_annotation_pruned",
                "aggregation.tests.AggregateAnnotationPruningTests"
                ".test_unused_aliased_aggregate_pruned",
                "aggregation.tests.AggregateTestCase.test_add_implementation",
                "aggregation.tests.AggregateTestCase.test_aggregation_subquery_annotation",
                "aggregation.tests.AggregateTestCase.test_count_star",
                "db_functions.datetime.test_extract_trunc.DateFunctionTests"
                ".test_extract_year_exact_lookup",
                "db_functions.datetime.test_extract_trunc.DateFunctionTests"
                ".test_extract_year_greaterthan_lookup",
                "db_functions.datetime.test_extract_trunc.DateFunctionTests"
                ".test_extract_year_lessthan_lookup",
                "db_functions.datetime.test_extract_trunc.DateFunctionWithTimeZoneTests"
                ".test_extract_year_exact_lookup",
                "db_functions.datetime.test_extract_trunc.DateFunctionWithTimeZoneTests"
                ".test_extract_year_greaterthan_lookup",
                "db_functions.datetime.test_extract_trunc.DateFunctionWithTimeZoneTests"
                ".test_extract_year_lessthan_lookup",
                "expressions.tests.ExistsTests.test_optimizations",
                "queries.test_db_returning.ReturningValuesTests.test_insert_returning",
                "queries.test_db_returning.ReturningValuesTests.test_insert_returning_multiple",
                "queries.tests.ExcludeTests.test_exclude_multivalued_exists",
                "queries.tests.ExistsSql.test_sliced_distinct_exists",
                "queries.tests.Queries1Tests.test_subquery_condition",
                "queries.tests.Queries6Tests.test_col_alias_quoted",
                "queries.tests.Queries6Tests.test_nested_queries_sql",
                "queries.tests.Ticket18785Tests.test_ticket_18785",
                "queries.tests.ValuesJoinPromotionTests.test_ticket_21376",
                "filtered_relation.tests.FilteredRelationTests"
                ".test_internal_queryset_alias_mapping",
                "aggregation.tests.AggregateAnnotationPruningTests"
                ".test_referenced_window_requires_wrapping",
                "auth_tests.test_management.CreatePermissionsMultipleDatabasesTests"
                ".test_set_permissions_fk_to_using_parameter",
                "expressions_window.tests.WindowFunctionTests.test_filter_count",
                "expressions_window.tests.WindowFunctionTests.test_range_n_preceding_and_following",
                "expressions_window.tests.WindowFunctionTests.test_range_unbound",
                "expressions_window.tests.WindowFunctionTests.test_row_range_both_following",
                "expressions_window.tests.WindowFunctionTests.test_row_range_both_preceding",
            }
        ),
    ),
    ExpectedFailures(
        "connection_internals",
        "mocks Django's cursor_iter to see how rows are fetched in chunks; rows come from "
        "the encrypted store here, not from a DB-API cursor",
        frozenset(
            {
                "queries.test_iterator.QuerySetIteratorTests.test_default_iterator_chunk_size",
                "queries.test_iterator.QuerySetIteratorTests.test_iterator_chunk_size",
            }
        ),
    ),
    ExpectedFailures(
        "query_count",
        "counts queries: a bulk_create() in several batches is one engine statement here",
        frozenset(
            {
                "bulk_create.tests.BulkCreateTransactionTests.test_multiple_batches",
                "bulk_create.tests.BulkCreateTransactionTests.test_objs_with_and_without_pk",
            }
        ),
    ),
)


def expected_failures() -> set[str]:
    """Every listed test, for ``DatabaseFeatures.django_test_expected_failures``."""
    return {test for group in GROUPS for test in group.tests}
