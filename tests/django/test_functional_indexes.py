"""Functional and partial indexes and unique constraints (derived columns).

Each is added by a real migration to a throwaway model holding records already, then kept
exact by every write path: ``create``, ``save()``, ``bulk_create``, ``bulk_update``,
``QuerySet.update()``, deletes. What must hold: uniqueness violations raise
``django.db.IntegrityError`` exactly when SQL's would, queries answer as without the
index, and the planner reads the index where it can (the plan names it).
"""

from __future__ import annotations

import pytest
from django.db import IntegrityError, migrations, models, transaction
from django.db.migrations.state import ProjectState
from django.db.models import F, Q
from django.db.models.functions import Lower, Upper

from django_zerodb.derived import is_derived
from django_zerodb.indexes import TrigramIndex
from tests.django.conftest import BOTH_STORES, db
from tests.django.test_migrations import APP, apply, indexes, records

pytestmark = [db, BOTH_STORES]


@pytest.fixture
def scratch(settings, store):
    settings.ZERODB_APPS = [*settings.ZERODB_APPS, APP]
    return store


PEOPLE = [
    ("Curry", "ann@x.org", True),
    ("curry", "Bob@x.org", True),
    ("CURRY", "cy@x.org", False),
    ("Adams", "dee@x.org", True),
    ("Éclair", "eve@x.org", None),
]


def person_state(alias):
    create = migrations.CreateModel(
        "Person",
        [
            ("id", models.BigAutoField(primary_key=True)),
            ("last", models.CharField(max_length=20, null=True)),
            ("email", models.CharField(max_length=40, null=True)),
            ("active", models.BooleanField(null=True)),
        ],
    )
    state = apply(alias, ProjectState(), create)
    Person = state.apps.get_model(APP, "Person")
    Person.objects.bulk_create(Person(last=a, email=b, active=c) for a, b, c in PEOPLE)
    return state


def person(state):
    return state.apps.get_model(APP, "Person")


def derived_values(alias):
    """The derived columns of every stored record, by pk."""
    return {
        pk: {k: v for k, v in fields.items() if is_derived(k)}
        for pk, fields in records(alias, "scratch_person").items()
    }


def plan_of(queryset) -> str:
    return queryset.explain()


def test_functional_index_is_built_kept_and_used(scratch):
    alias = scratch
    state = person_state(alias)
    index = models.Index(Lower("last"), name="person_lower_last")
    state = apply(alias, state, migrations.AddIndex("Person", index))
    Person = person(state)
    (name,) = [n for n, (cols, _) in indexes(alias, "scratch_person").items() if cols[0][0] == "~"]
    lowered = {pk: next(iter(v.values())) for pk, v in derived_values(alias).items()}
    assert sorted(lowered.values()) == sorted(p[0].lower() for p in PEOPLE)
    found = Person.objects.filter(last__iexact="cURRY")
    assert name in plan_of(found)
    assert found.count() == 3
    assert Person.objects.filter(last__istartswith="cu").count() == 3
    assert name in plan_of(Person.objects.annotate(low=Lower("last")).filter(low="curry"))
    assert Person.objects.annotate(low=Lower("last")).filter(low="curry").count() == 3
    # Every write path keeps the derived value in step.
    ann = Person.objects.get(email="ann@x.org")
    ann.last = "Zola"
    ann.save()
    Person.objects.filter(email="Bob@x.org").update(last=Upper(F("email")))
    Person.objects.bulk_create([Person(last="MIXed")])
    dee = Person.objects.get(email="dee@x.org")
    dee.last = "Curry"
    Person.objects.bulk_update([dee], ["last"])
    Person.objects.filter(email="cy@x.org").delete()
    stored = records(alias, "scratch_person")
    for fields in stored.values():
        (value,) = [v for k, v in fields.items() if is_derived(k)]
        assert value == (fields["last"].lower() if fields["last"] is not None else None)
    assert sorted(Person.objects.filter(last__iexact="curry").values_list("email", flat=True)) == [
        "dee@x.org"
    ]
    assert Person.objects.filter(last__iexact="bob@x.org").count() == 1
    assert Person.objects.filter(last__iexact="mixed").count() == 1
    # Removing the index drops the derived values from the records.
    state = apply(alias, state, migrations.RemoveIndex("Person", "person_lower_last"))
    assert not any(derived_values(alias).values())
    assert person(state).objects.filter(last__iexact="CURRY").count() == 1


def test_unique_lower_constraint(scratch):
    alias = scratch
    state = person_state(alias)
    unique = models.UniqueConstraint(Lower("email"), name="person_email_ci")
    state = apply(alias, state, migrations.AddConstraint("Person", unique))
    Person = person(state)
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        Person.objects.create(email="ANN@X.ORG")
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        Person.objects.bulk_create([Person(email="new@x.org"), Person(email="NEW@x.org")])
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        Person.objects.filter(email="dee@x.org").update(email="EVE@x.org")
    Person.objects.create(email=None)
    Person.objects.create(email=None)  # NULLs repeat
    Person.objects.filter(email="eve@x.org").delete()
    Person.objects.create(email="EVE@x.org")  # free again
    assert Person.objects.filter(email__iexact="eve@X.org").count() == 1
    # A migration adding it over data that violates it fails, and leaves nothing.
    state2 = person_state_again(alias, state)
    assert state2 is not None


def person_state_again(alias, state):
    """Duplicates in another case: the constraint cannot be added."""
    Person = person(state)
    apply(alias, state, migrations.RemoveConstraint("Person", "person_email_ci"))
    Person.objects.create(email="Ann@x.org")
    unique = models.UniqueConstraint(Lower("email"), name="person_email_ci")
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        apply(alias, state, migrations.AddConstraint("Person", unique))
    return state


def test_conditional_unique_constraint(scratch):
    alias = scratch
    state = person_state(alias)
    unique = models.UniqueConstraint(
        fields=["last"], condition=Q(active=True), name="person_active_last"
    )
    state = apply(alias, state, migrations.AddConstraint("Person", unique))
    Person = person(state)
    Person.objects.create(last="Adams", active=False)  # outside the condition
    Person.objects.create(last="Adams", active=None)  # NULL is not True
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        Person.objects.create(last="Adams", active=True)
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        Person.objects.filter(last="Adams", active=False).update(active=True)
    Person.objects.filter(last="Adams", active=True).update(active=False)
    Person.objects.filter(last="Adams", active=None).update(active=True)  # now allowed
    assert Person.objects.filter(last="Adams", active=True).count() == 1


def test_partial_index_serves_queries_implying_its_condition(scratch):
    alias = scratch
    state = person_state(alias)
    partial = models.Index(fields=["email"], condition=Q(active=True), name="active_email")
    state = apply(alias, state, migrations.AddIndex("Person", partial))
    Person = person(state)
    (name,) = [n for n, (cols, _) in indexes(alias, "scratch_person").items() if cols[0][0] == "~"]
    implied = Person.objects.filter(active=True, email="ann@x.org")
    assert name in plan_of(implied)
    assert implied.count() == 1
    not_implied = Person.objects.filter(email="cy@x.org")
    assert name not in plan_of(not_implied)
    assert not_implied.count() == 1
    assert Person.objects.filter(active=True, email="cy@x.org").count() == 0
    Person.objects.filter(email="cy@x.org").update(active=True)
    assert Person.objects.filter(active=True, email="cy@x.org").count() == 1


def test_alter_field_under_a_functional_index_recomputes_it(scratch):
    alias = scratch
    state = person_state(alias)
    index = models.Index(Lower("last"), name="person_lower_last")
    state = apply(alias, state, migrations.AddIndex("Person", index))
    wider = models.CharField(max_length=50, null=True)
    state = apply(alias, state, migrations.AlterField("Person", "last", wider))
    Person = person(state)
    assert Person.objects.filter(last__iexact="CURRY").count() == 3
    assert len([n for n in indexes(alias, "scratch_person") if "~" in n]) == 1


def test_ordering_by_an_indexed_expression_reads_the_index(scratch):
    alias = scratch
    state = person_state(alias)
    Person = person(state)
    unindexed = list(Person.objects.order_by(Lower("last"), "pk").values_list("pk", flat=True))
    index = models.Index(Upper("last"), name="person_upper_last")
    state = apply(alias, state, migrations.AddIndex("Person", index))
    Person = person(state)
    ordered = Person.objects.order_by(Upper("last"), "pk")
    select = ordered.query.get_compiler(alias).select_query()
    select._plan()
    column, descending = select._index_order()  # read in the order of the index
    assert is_derived(column) and not descending
    expected = sorted(
        Person.objects.values_list("pk", "last"),
        key=lambda r: (r[1] is not None, (r[1] or "").upper(), r[0]),
    )
    assert list(ordered.values_list("pk", flat=True)) == [pk for pk, _ in expected]
    descending = list(
        Person.objects.order_by(Upper("last").desc(), "-pk").values_list("pk", flat=True)
    )
    assert descending == [pk for pk, _ in reversed(expected)]
    assert len(unindexed) == len(expected)


def test_conditional_unique_constraint_on_an_expression(scratch):
    alias = scratch
    state = person_state(alias)
    unique = models.UniqueConstraint(
        Lower("email"), condition=Q(active=True), name="active_email_ci"
    )
    state = apply(alias, state, migrations.AddConstraint("Person", unique))
    Person = person(state)
    Person.objects.create(email="ANN@x.org", active=False)  # outside the condition
    with pytest.raises(IntegrityError), transaction.atomic(using=alias):
        Person.objects.create(email="ANN@X.org", active=True)
    Person.objects.filter(email="ann@x.org").update(active=False)
    Person.objects.create(email="ANN@X.org", active=True)  # the old one left it
    assert Person.objects.filter(email__iexact="ann@x.org").count() == 3


def test_index_builds_report_their_progress(scratch, monkeypatch):
    """A migration's index build tells its progress bar about every record."""
    from django_zerodb import schema

    reports: list[tuple[int, int]] = []

    class Bar:
        def __init__(self, total, label):
            self.n, self.total = 0, total

        def update(self, n):
            self.n += n
            reports.append((self.n, self.total))

        def close(self):
            pass

    monkeypatch.setattr(schema, "_progress", Bar)
    alias = scratch
    state = person_state(alias)
    apply(alias, state, migrations.AddIndex("Person", TrigramIndex(fields=["last"], name="t")))
    assert reports and reports[-1] == (len(PEOPLE), len(PEOPLE))
