"""Generic relations on both databases: the content type restricts every join (a
``Pet`` and a ``Plant`` with the same primary key never share labels), and a text
object id matches an integer primary key as SQLite compares them.
"""

from __future__ import annotations

import pytest
from django.contrib.contenttypes.models import ContentType
from django.db.models import Count, Prefetch

from tests.django.difftest.models import Label, Pet, Plant
from tests.django.difftest.test_differential import ENC, PLAIN

pytestmark = pytest.mark.django_db(databases=["default", ENC, PLAIN])


def label(obj, text: str) -> Label:
    """A label of ``obj`` (its content type read from the default database, where
    contenttypes lives)."""
    kind = ContentType.objects.db_manager("default").get_for_model(type(obj))
    return Label(content_type_id=kind.pk, object_id=str(obj.pk), text=text)


@pytest.fixture
def garden():
    for using in (PLAIN, ENC):
        pets = Pet.objects.using(using).bulk_create([Pet(pk=i, name=f"pet{i}") for i in (1, 2, 3)])
        plants = Plant.objects.using(using).bulk_create(
            [Plant(pk=i, name=f"plant{i}") for i in (1, 2, 4)]
        )
        labels = [
            label(pets[0], "fatty"),
            label(pets[1], "tame"),
            label(plants[0], "fatty"),
            label(plants[2], "tall"),
        ]
        Label.objects.using(using).bulk_create(labels)


def both(make):
    plain, encrypted = make(PLAIN), make(ENC)
    assert plain == encrypted, f"\nsqlite:    {plain!r}\nencrypted: {encrypted!r}"
    return encrypted


@pytest.mark.parametrize(
    "make",
    [
        lambda m: m.filter(labels__text="fatty"),
        lambda m: m.exclude(labels__text="fatty"),
        lambda m: m.filter(labels__isnull=True),
        lambda m: m.annotate(n=Count("labels")).filter(n__gt=0),
    ],
    ids=["filter", "exclude", "isnull", "count"],
)
@pytest.mark.parametrize("model", [Pet, Plant], ids=["pet", "plant"])
def test_content_type_restricts_joins(garden, model, make):
    both(lambda using: sorted(o.name for o in make(model.objects.using(using))))


def test_reverse_filters_and_prefetch(garden):
    both(
        lambda using: sorted(lb.text for lb in Label.objects.using(using).filter(pets__name="pet1"))
    )

    def prefetched(using):
        labels = (
            Label.objects.using(using)
            .order_by("pk")
            .prefetch_related(Prefetch("pets", queryset=Pet.objects.using(using)), "plants")
        )
        return [
            ([p.name for p in lb.pets.all()], [p.name for p in lb.plants.all()]) for lb in labels
        ]

    got = both(prefetched)
    assert any(pets for pets, _ in got) and any(plants for _, plants in got)
