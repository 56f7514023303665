"""Models of the differential test: the same classes live in SQLite ("plain") and in the
encrypted database ("encrypted"); queries choose one with ``.using()``.

Some fields are indexed (``db_index``) and some not, so that the encrypted backend
answers conditions both from index scans and by evaluating them in Python. ``Item.name``
also has a ``Lower`` index (``iexact``, ``istartswith``), ``Item.code`` a trigram index
(the pattern lookups), and ``Group.name`` neither: every string lookup runs with and
without them.
"""

from django.contrib.contenttypes.fields import GenericForeignKey, GenericRelation
from django.db import models
from django.db.models.functions import Lower

from django_zerodb.indexes import TrigramIndex


class Group(models.Model):
    name = models.CharField(max_length=40, null=True, db_index=True)
    rank = models.IntegerField(null=True)

    class Meta:
        app_label = "difftest"


class Item(models.Model):
    name = models.CharField(max_length=40, null=True, db_index=True)
    code = models.CharField(max_length=40, null=True)
    n = models.IntegerField(null=True, db_index=True)
    m = models.IntegerField(null=True)
    price = models.DecimalField(max_digits=12, decimal_places=2, null=True, db_index=True)
    day = models.DateField(null=True, db_index=True)
    at = models.DateTimeField(null=True)
    flag = models.BooleanField(default=False, db_index=True)
    group = models.ForeignKey(Group, null=True, on_delete=models.SET_NULL, related_name="items")

    class Meta:
        app_label = "difftest"
        indexes = [
            models.Index(Lower("name"), name="item_lower_name"),
            TrigramIndex(fields=["code"], name="item_code_trgm"),
        ]


class Doc(models.Model):
    """JSON documents (test_json.py): SQL NULL, JSON null, scalars, nested objects."""

    value = models.JSONField(null=True)
    n = models.IntegerField(null=True)

    class Meta:
        app_label = "difftest"


class Label(models.Model):
    """A generic relation's rows (test_relations.py): a text object id, as Django allows,
    which SQLite compares with an integer primary key by numeric affinity."""

    content_type = models.ForeignKey(
        "contenttypes.ContentType", on_delete=models.CASCADE, db_constraint=False
    )
    object_id = models.CharField(max_length=40)
    content_object = GenericForeignKey("content_type", "object_id")
    text = models.CharField(max_length=40)

    class Meta:
        app_label = "difftest"


class Pet(models.Model):
    name = models.CharField(max_length=40)
    labels = GenericRelation(Label, related_query_name="pets")

    class Meta:
        app_label = "difftest"


class Plant(models.Model):
    name = models.CharField(max_length=40)
    labels = GenericRelation(Label, related_query_name="plants")

    class Meta:
        app_label = "difftest"
