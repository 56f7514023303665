"""Migrations on the encrypted store: the real ``migrate`` command both ways, and the
schema editor driven by migration operations on a throwaway app (``scratch``, a project
state that exists only in the test, routed to the encrypted database by adding it to
``ZERODB_APPS``).

There is no DDL: a model is a catalog entry with indexes, a record is a map. What must
hold is what a user sees: AddField with a default rewrites the existing records,
RemoveField and RenameField rewrite them too, indexes and unique constraints appear and
disappear in the catalog and are enforced, and SQL operations refuse. Everything runs
inside the test's transaction (rolled back at the end), on both stores.
"""

from __future__ import annotations

from collections import Counter

import pytest
from django.core.management import call_command
from django.db import (
    IntegrityError,
    NotSupportedError,
    connections,
    migrations,
    models,
    transaction,
)
from django.db.migrations.migration import Migration
from django.db.migrations.state import ModelState, ProjectState

from django_zerodb.indexes import TextIndex
from tests.django.conftest import BOTH_STORES, db
from tests.django.testapp.models import Department, Employee

pytestmark = [db, BOTH_STORES]

APP = "scratch"


@pytest.fixture
def scratch(settings, store):
    """Route the throwaway app to the encrypted database under test."""
    settings.ZERODB_APPS = [*settings.ZERODB_APPS, APP]
    return store


def apply(alias, state, *operations):
    """Apply operations as one migration; return the new project state."""
    migration = Migration("step", APP)
    migration.operations = list(operations)
    with connections[alias].schema_editor(atomic=True) as editor:
        return migration.apply(state, editor)


def records(alias, table):
    """The stored records of a table, as maps (what the store really holds)."""
    view = connections[alias].session.view()
    found = view.table(table)
    return {} if found is None else dict(view.run([found.scan_reader()])[0])


def indexes(alias, table):
    return {
        name: (info["columns"], info["unique"])
        for name, info in connections[alias].introspection.get_constraints(None, table).items()
    }


def tables(alias):
    return set(connections[alias].introspection.table_names())


def pet_state(alias):
    create = migrations.CreateModel(
        "Pet",
        [
            ("id", models.BigAutoField(primary_key=True)),
            ("name", models.CharField(max_length=20)),
            ("age", models.IntegerField(null=True, db_index=True)),
        ],
    )
    return apply(alias, ProjectState(), create)


def pets(state, names_ages):
    Pet = state.apps.get_model(APP, "Pet")
    for name, age in names_ages:
        Pet.objects.create(name=name, age=age)
    return Pet


DATA = [("Rex", 3), ("Tom", None), ("Kit", 7), ("Rex", 1)]


# -- the migrate command -------------------------------------------------------------------


def test_migrate_command_both_ways(alias, hr):
    created = {"testapp_setting", "testapp_badge", "testapp_project", "testapp_assignment"}
    assert created <= tables(alias)
    call_command("migrate", "testapp", "0001", database=alias, verbosity=0)
    assert not created & tables(alias)
    assert Employee.objects.count() == len(hr.employees)  # older tables are untouched
    call_command("migrate", "testapp", "zero", database=alias, verbosity=0)
    assert not {t for t in tables(alias) if t.startswith("testapp_")}
    call_command("migrate", "testapp", database=alias, verbosity=0)
    assert created | {"testapp_employee", "testapp_tag_employees"} <= tables(alias)
    assert indexes(alias, "testapp_employee") == {
        "u:email": (["email"], True),
        "f:first_name": (["first_name"], False),
        "f:salary": (["salary"], False),
        "f:hire_date": (["hire_date"], False),
        "f:department_id": (["department_id"], False),
        "t:bio": (["bio"], False),
    }
    Department.objects.create(name="again")
    assert list(Department.objects.values_list("name", flat=True)) == ["again"]


@pytest.mark.django_db(databases="__all__")  # the check reads every database's history
def test_models_match_their_migrations():
    # TextIndex deconstructs, and the migrations describe the models exactly.
    call_command("makemigrations", "testapp", check=True, dry_run=True, verbosity=0)


# -- the schema editor through operations --------------------------------------------------


def test_create_and_delete_model(scratch):
    alias = scratch
    state = pet_state(alias)
    assert "scratch_pet" in tables(alias)
    assert indexes(alias, "scratch_pet") == {"f:age": (["age"], False)}
    Pet = pets(state, DATA)
    assert sorted(Pet.objects.values_list("name", flat=True)) == sorted(n for n, _ in DATA)
    apply(alias, state, migrations.DeleteModel("Pet"))
    assert "scratch_pet" not in tables(alias)


def test_add_field_with_default_rewrites_records(scratch):
    alias = scratch
    state = pet_state(alias)
    pets(state, DATA)
    state = apply(
        alias,
        state,
        migrations.AddField("Pet", "legs", models.IntegerField(default=4, db_index=True)),
        migrations.AddField("Pet", "owner", models.CharField(max_length=20, null=True)),
    )
    stored = records(alias, "scratch_pet")
    assert [r["legs"] for r in stored.values()] == [4] * len(DATA)
    assert all(r.get("owner") is None for r in stored.values())
    Pet = state.apps.get_model(APP, "Pet")
    assert Pet.objects.filter(legs=4).count() == len(DATA)  # served by the new index
    assert "f:legs" in indexes(alias, "scratch_pet")
    Pet.objects.create(name="Tri", legs=3)
    assert Pet.objects.filter(legs__lt=4).count() == 1


def test_remove_field(scratch):
    alias = scratch
    state = pet_state(alias)
    pets(state, DATA)
    state = apply(alias, state, migrations.RemoveField("Pet", "age"))
    assert all("age" not in r for r in records(alias, "scratch_pet").values())
    assert "f:age" not in indexes(alias, "scratch_pet")
    Pet = state.apps.get_model(APP, "Pet")
    assert Pet.objects.filter(name="Rex").count() == sum(n == "Rex" for n, _ in DATA)


def test_rename_field(scratch):
    alias = scratch
    state = pet_state(alias)
    pets(state, DATA)
    state = apply(alias, state, migrations.RenameField("Pet", "age", "years"))
    stored = records(alias, "scratch_pet").values()
    assert Counter((r["name"], r["years"]) for r in stored) == Counter(DATA)
    assert all("age" not in r for r in stored)
    assert indexes(alias, "scratch_pet") == {"f:years": (["years"], False)}
    Pet = state.apps.get_model(APP, "Pet")
    assert sorted(Pet.objects.filter(years__gt=2).values_list("name", flat=True)) == sorted(
        n for n, a in DATA if a is not None and a > 2
    )


def test_add_and_remove_index(scratch):
    alias = scratch
    state = pet_state(alias)
    pets(state, DATA)
    index = models.Index(fields=["name"], name="pet_name_idx")
    state = apply(alias, state, migrations.AddIndex("Pet", index))
    assert indexes(alias, "scratch_pet")["f:name"] == (["name"], False)
    Pet = state.apps.get_model(APP, "Pet")
    assert Pet.objects.filter(name__startswith="R").count() == sum(
        n.startswith("R") for n, _ in DATA
    )
    state = apply(alias, state, migrations.RemoveIndex("Pet", "pet_name_idx"))
    assert "f:name" not in indexes(alias, "scratch_pet")
    text = TextIndex(fields=["name"], name="pet_name_text")
    state = apply(alias, state, migrations.AddIndex("Pet", text))
    Pet = state.apps.get_model(APP, "Pet")
    assert Pet.objects.filter(name__search="rex").count() == sum(n == "Rex" for n, _ in DATA)


def test_alter_field_to_unique_enforces_it(scratch):
    alias = scratch
    state = pet_state(alias)
    pets(state, [("A", 1), ("B", 2)])
    unique = models.CharField(max_length=20, unique=True)
    state = apply(alias, state, migrations.AlterField("Pet", "name", unique))
    assert indexes(alias, "scratch_pet")["u:name"] == (["name"], True)
    Pet = state.apps.get_model(APP, "Pet")
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        Pet.objects.create(name="A")
    state = apply(
        alias, state, migrations.AlterField("Pet", "name", models.CharField(max_length=20))
    )
    assert "u:name" not in indexes(alias, "scratch_pet")
    state.apps.get_model(APP, "Pet").objects.create(name="A")


def test_alter_field_to_unique_with_duplicates_fails(scratch):
    alias = scratch
    state = pet_state(alias)
    pets(state, DATA)  # "Rex" twice
    unique = models.CharField(max_length=20, unique=True)
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        apply(alias, state, migrations.AlterField("Pet", "name", unique))
    assert "u:name" not in indexes(alias, "scratch_pet")


def test_unique_constraint_and_unique_together(scratch):
    alias = scratch
    state = pet_state(alias)
    pets(state, [("A", 1)])
    constraint = models.UniqueConstraint(fields=["name", "age"], name="pet_name_age")
    state = apply(alias, state, migrations.AddConstraint("Pet", constraint))
    Pet = state.apps.get_model(APP, "Pet")
    Pet.objects.create(name="A", age=2)
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        Pet.objects.create(name="A", age=1)
    state = apply(alias, state, migrations.RemoveConstraint("Pet", "pet_name_age"))
    state.apps.get_model(APP, "Pet").objects.create(name="A", age=1)
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        apply(alias, state, migrations.AlterUniqueTogether("Pet", {("name", "age")}))
    Pet = state.apps.get_model(APP, "Pet")
    Pet.objects.filter(name="A", age=1).first().delete()
    state = apply(alias, state, migrations.AlterUniqueTogether("Pet", {("name", "age")}))
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        state.apps.get_model(APP, "Pet").objects.create(name="A", age=2)


def test_unique_constraint_on_plain_field_expressions(scratch):
    """``UniqueConstraint(F("name"), "age")`` names fields: enforced as ``fields=``."""
    alias = scratch
    state = pet_state(alias)
    constraint = models.UniqueConstraint(models.F("name"), "age", name="pet_name_age_expr")
    state = apply(alias, state, migrations.AddConstraint("Pet", constraint))
    Pet = state.apps.get_model(APP, "Pet")
    Pet.objects.create(name="A", age=1)
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        Pet.objects.create(name="A", age=1)


def test_check_constraint_added_by_a_migration_is_enforced(scratch):
    alias = scratch
    state = pet_state(alias)
    adult = models.CheckConstraint(condition=models.Q(age__gte=18), name="pet_adult")
    state = apply(alias, state, migrations.AddConstraint("Pet", adult))
    Pet = state.apps.get_model(APP, "Pet")
    Pet.objects.create(name="Old", age=18)
    Pet.objects.create(name="Unknown", age=None)  # NULL passes a CHECK
    with pytest.raises(IntegrityError, match="pet_adult"), transaction.atomic(using=alias):
        Pet.objects.create(name="Young", age=3)
    state = apply(alias, state, migrations.RemoveConstraint("Pet", "pet_adult"))
    state.apps.get_model(APP, "Pet").objects.create(name="Young", age=3)


def test_rename_model_keeps_records(scratch):
    alias = scratch
    state = pet_state(alias)
    pets(state, DATA)
    state = apply(alias, state, migrations.RenameModel("Pet", "Animal"))
    assert "scratch_pet" not in tables(alias)
    Animal = state.apps.get_model(APP, "Animal")
    assert Animal.objects.count() == len(DATA)
    assert Animal.objects.filter(age=7).get().name == "Kit"


def test_relations_in_migrations(scratch):
    alias = scratch
    state = pet_state(alias)
    state = apply(
        alias,
        state,
        migrations.CreateModel(
            "Owner",
            [
                ("id", models.BigAutoField(primary_key=True)),
                ("name", models.CharField(max_length=20)),
                ("pets", models.ManyToManyField(f"{APP}.Pet", related_name="owners")),
            ],
        ),
        migrations.AddField(
            "Pet",
            "vet",
            models.ForeignKey(f"{APP}.Owner", models.SET_NULL, null=True, related_name="+"),
        ),
    )
    assert {"scratch_owner", "scratch_owner_pets"} <= tables(alias)
    assert "f:vet_id" in indexes(alias, "scratch_pet")
    Pet, Owner = state.apps.get_model(APP, "Pet"), state.apps.get_model(APP, "Owner")
    ann = Owner.objects.create(name="Ann")
    rex = Pet.objects.create(name="Rex", vet=ann)
    ann.pets.add(rex)
    assert list(Owner.objects.filter(pets__name="Rex").values_list("name", flat=True)) == ["Ann"]
    assert Pet.objects.get(vet__name="Ann").pk == rex.pk
    state = apply(alias, state, migrations.RemoveField("Owner", "pets"))
    assert "scratch_owner_pets" not in tables(alias)


def test_run_python_and_run_sql(scratch):
    alias = scratch
    state = pet_state(alias)
    pets(state, DATA)

    def birthday(apps, schema_editor):
        Pet = apps.get_model(APP, "Pet")
        Pet.objects.using(schema_editor.connection.alias).filter(age__isnull=False).update(
            age=models.F("age") + 1
        )

    state = apply(alias, state, migrations.RunPython(birthday))
    ages = state.apps.get_model(APP, "Pet").objects.values_list("age", flat=True)
    assert Counter(ages) == Counter(None if a is None else a + 1 for _, a in DATA)
    with pytest.raises(NotSupportedError, match="RunPython"), transaction.atomic(using=alias):
        apply(alias, state, migrations.RunSQL("UPDATE scratch_pet SET age = 0"))


def test_unsupported_index_kinds_refuse(scratch):
    alias = scratch
    state = pet_state(alias)
    covering = models.Index(fields=["age"], name="ages", include=["name"])
    with pytest.raises(NotSupportedError, match="include="), transaction.atomic(using=alias):
        apply(alias, state, migrations.AddIndex("Pet", covering))
    opclass = models.Index(fields=["name"], name="names", opclasses=["varchar_pattern_ops"])
    with pytest.raises(NotSupportedError, match="opclasses="), transaction.atomic(using=alias):
        apply(alias, state, migrations.AddIndex("Pet", opclass))


def test_model_state_round_trip(scratch):
    # A CreateModel built from a live model's state creates the same catalog entry.
    alias = scratch
    state = ProjectState()
    model_state = ModelState.from_model(Employee)
    fields = [(n, f.clone()) for n, f in model_state.fields.items() if not f.is_relation]
    create = migrations.CreateModel(
        "Person", fields, options={"indexes": [TextIndex(fields=["bio"], name="p_bio")]}
    )
    state = apply(alias, state, create)
    assert {name for name in indexes(alias, "scratch_person")} == {
        "u:email",
        "f:first_name",
        "f:salary",
        "f:hire_date",
        "t:bio",
    }


def test_composite_primary_key_refused(alias, scratch):
    """Joins and lookups match one key column: a model with a composite key may be
    migrated (other models of its app keep working) but is refused when read or written."""
    create = migrations.CreateModel(
        "Pair",
        [
            ("pk", models.CompositePrimaryKey("a", "b")),
            ("a", models.IntegerField()),
            ("b", models.IntegerField()),
        ],
    )
    state = apply(alias, ProjectState(), create)
    Pair = state.apps.get_model(APP, "Pair")
    with pytest.raises(NotSupportedError, match="composite primary keys"):
        Pair.objects.create(a=1, b=2)
    with pytest.raises(NotSupportedError, match="composite primary keys"):
        list(Pair.objects.filter(pk=("1", "2")))


def test_generated_field_computed_on_writes_and_for_stored_rows(alias, scratch):
    """GeneratedField is computed by the backend: on insert, on update, and for the
    rows already stored when a migration adds it or changes its expression."""
    state = pet_state(alias)
    Pet = pets(state, DATA)
    add = migrations.AddField(
        "Pet",
        "double",
        models.GeneratedField(
            expression=models.F("age") * 2, output_field=models.IntegerField(), db_persist=True
        ),
    )
    state = apply(alias, state, add)
    Pet = state.apps.get_model(APP, "Pet")
    got = sorted(Pet.objects.values_list("age", "double"), key=repr)
    assert got == sorted([(age, None if age is None else age * 2) for _, age in DATA], key=repr)
    kit = Pet.objects.create(name="Max", age=5)
    assert kit.double == 10  # returned by the INSERT
    Pet.objects.filter(pk=kit.pk).update(age=6)
    assert Pet.objects.get(pk=kit.pk).double == 12
    alter = migrations.AlterField(
        "Pet",
        "double",
        models.GeneratedField(
            expression=models.F("age") + 100, output_field=models.IntegerField(), db_persist=True
        ),
    )
    state = apply(alias, state, alter)
    Pet = state.apps.get_model(APP, "Pet")
    assert Pet.objects.get(pk=kit.pk).double == 106
    assert Pet.objects.filter(double__gte=100).count() == len([a for _, a in DATA if a]) + 1
