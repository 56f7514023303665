"""What the catalog (inside the encrypted root) says about tables.

Migrations and ``TransactionTestCase`` ask which tables exist; the answer is the models
of the catalog. Column-level introspection (``inspectdb``) has nothing to read: records
are schemaless msgpack maps, and the catalog keeps indexes, not columns.
"""

from __future__ import annotations

from django.db.backends.base.introspection import BaseDatabaseIntrospection, TableInfo

from django_zerodb.exceptions import NotSupportedError


class DatabaseIntrospection(BaseDatabaseIntrospection):
    def get_table_list(self, cursor) -> list[TableInfo]:
        catalog = self.connection.session.view().catalog
        return [TableInfo(name, "t") for name in sorted(catalog.models)]

    def get_table_description(self, cursor, table_name: str):
        raise NotSupportedError(
            "the encrypted database keeps no column definitions; inspectdb cannot work "
            "on it (the models are the schema)"
        )

    def get_sequences(self, cursor, table_name: str, table_fields=()) -> list:
        return []

    def get_relations(self, cursor, table_name: str) -> dict:
        return {}

    def get_primary_key_columns(self, cursor, table_name: str) -> list:
        return []

    def get_constraints(self, cursor, table_name: str) -> dict:
        """Indexes of ``table_name`` from the catalog, shaped as Django expects."""
        spec = self.connection.session.view().catalog.get(table_name)
        if spec is None:
            return {}
        return {
            index.name: {
                "columns": list(index.fields),
                "primary_key": False,
                "unique": index.kind == "unique",
                "foreign_key": None,
                "check": False,
                "index": True,
                "type": index.kind,
                "orders": [],
            }
            for index in spec.indexes.values()
        }
