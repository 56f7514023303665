"""``ZeroModelAdmin``: a ``ModelAdmin`` with defaults that suit encrypted models.

The store answers from its indexes what an index can answer (equality, ranges, prefixes,
full-text search, counts, ordering by one indexed field) and evaluates everything else on
decrypted records: correct, but a scan of the candidates. The defaults lean on the
indexes:

* ``ordering = ("-pk",)``: the newest first, paged straight from the primary key tree
  (a model's ``Meta.ordering`` on several fields would sort every row in memory). When a
  column is sorted, the tie-breaking primary key follows that column's direction, so an
  indexed column is paged by its index too.
* ``list_per_page = 50``; ``show_full_result_count`` stays on: ``count()`` is served by
  the counted indexes.
* ``search_fields`` prefixes are read for the index (see :meth:`get_search_results`):

  ======== ============================== ==========================================
  prefix   lookup                         served by
  ======== ============================== ==========================================
  ``@``    ``search`` (whole words,       the field's ``TextIndex``; results ranked
           "quoted phrases")              (BM25) when no column is sorted
  ``^``    ``istartswith``; ``startswith`` a ``Lower(field)`` index; else the
           if the field has an index but  field's own index, **case-sensitive**;
           no ``Lower`` one               else decrypted records (a scan)
  ``=``    ``iexact``; ``exact`` if the   as ``^``
           field has an index but no
           ``Lower`` one
  (none)   ``icontains``                  the field's ``TrigramIndex`` (fragments of
                                          3 characters or more), else a scan
  ======== ============================== ==========================================

  ``search_help_text`` is written from ``search_fields`` unless you set it. A search
  of more than ``max_search_words`` words (or "quoted phrases") finds nothing and says
  why: each word adds a condition on every search field.

Used on a model of another database, ``ZeroModelAdmin`` keeps Django's search lookups.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import lookup_spawns_duplicates
from django.contrib.admin.views.main import ORDER_VAR, ChangeList
from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.core.paginator import InvalidPage
from django.db import connections, models, router
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpResponseRedirect
from django.utils.text import smart_split, unescape_string_literal

from django_zerodb.compat import has_column
from django_zerodb.derived import lowered_column
from django_zerodb.exceptions import SerializationError
from django_zerodb.indexes import TextIndex, model_spec
from django_zerodb.substring import trigram_fields

SEARCH = "search"


@dataclass(frozen=True, slots=True)
class SearchLookup:
    """One entry of ``search_fields``, read for the encrypted database."""

    spec: str  # as written in search_fields ("^last_name")
    path: str  # the field path ("last_name", "department__name")
    lookup: str  # "search", "startswith", "istartswith", "exact", "iexact", "icontains" ...
    field: models.Field | None  # the last field of the path, if it names one
    indexed: bool  # served by an index

    @property
    def orm_lookup(self) -> str:
        return f"{self.path}{LOOKUP_SEP}{self.lookup}"

    def value(self, bit: str, phrase: bool) -> Any:
        """The value to look up for one word (or quoted phrase) of the search; ``None``
        when it cannot be a value of the field (``=salary`` searched for "abc")."""
        if self.lookup == SEARCH:
            if phrase:
                words = bit.replace('"', " ").split()
                return f'"{" ".join(words)}"' if words else ""
            return bit
        if self.field is None or isinstance(self.field, (models.CharField, models.TextField)):
            return bit
        if self.lookup not in ("exact", "iexact"):
            return bit
        try:
            return self.field.to_python(bit)
        except (ValidationError, ValueError, TypeError):
            return None

    def describe(self) -> str:
        name = str(self.field.verbose_name) if self.field is not None else self.path
        name = name[:1].upper() + name[1:]
        return {
            SEARCH: f"{name} contains every word (“quoted phrases” in order)",
            "startswith": f"{name} starts with (case-sensitive)",
            "istartswith": f"{name} starts with",
            "exact": f"{name} is (exactly)",
            "iexact": f"{name} is",
        }.get(self.lookup, f"{name} contains")


def is_encrypted(model: type[models.Model]) -> bool:
    """Whether ``model`` is read from a django_zerodb database."""
    return connections[router.db_for_read(model)].vendor == "zerodb"


def path_field(model: type[models.Model], path: str) -> models.Field | None:
    """The field that the last part of ``path`` names (across relations), or None."""
    opts, field = model._meta, None
    for part in path.split(LOOKUP_SEP):
        if field is not None:
            if not getattr(field, "path_infos", None):
                return None  # a transform or lookup after a plain field
            opts = field.path_infos[-1].to_opts
        try:
            field = opts.get_field(opts.pk.name if part == "pk" else part)
        except FieldDoesNotExist:
            return None
    return field


def is_indexed(field: models.Field | None) -> bool:
    """Whether an ordered index of the encrypted database serves ``field``."""
    if field is None or not has_column(field):
        return False
    if field.primary_key:
        return True
    return model_spec(field.model).ordered_index_for(field.column) is not None


def has_text_index(field: models.Field | None) -> bool:
    """Whether a ``TextIndex`` covers ``field``."""
    return field is not None and any(
        isinstance(index, TextIndex) and list(index.fields) == [field.name]
        for index in field.model._meta.indexes
    )


def search_lookup(model: type[models.Model], spec: str) -> SearchLookup:
    """How ``ZeroModelAdmin`` searches one entry of ``search_fields``."""
    spec = str(spec)
    prefix = spec[:1] if spec[:1] in "^=@" else ""
    path = spec[len(prefix) :]
    field = path_field(model, path)
    if field is None and LOOKUP_SEP in path:
        # The path ends in an explicit lookup ("name__exact"): as Django, use it as is.
        head, _, lookup = path.rpartition(LOOKUP_SEP)
        field = path_field(model, head)
        indexed = lookup in ("exact", "startswith") and is_indexed(field)
        return SearchLookup(spec, head, lookup, field, indexed)
    if prefix == "@":
        return SearchLookup(spec, path, SEARCH, field, has_text_index(field))
    # Indexes of computed values serve lookups on the model's own fields only.
    local = field is not None and LOOKUP_SEP not in path and field.model is model
    textual = isinstance(field, (models.CharField, models.TextField))
    if prefix in ("^", "="):
        if local and textual and lowered_column(model, field.column) is not None:
            lookup, indexed = ("istartswith" if prefix == "^" else "iexact"), True
        elif prefix == "^":
            indexed = is_indexed(field) and textual
            lookup = "startswith" if indexed else "istartswith"
        else:
            indexed = is_indexed(field)
            lookup = "exact" if indexed else "iexact"
        return SearchLookup(spec, path, lookup, field, indexed)
    trigram = local and field.column in trigram_fields(model)
    return SearchLookup(spec, path, "icontains", field, trigram)


def search_bits(search_term: str) -> list[tuple[str, bool]]:
    """The words of a search, as Django's admin splits them: ``(bit, quoted)``."""
    bits = []
    for bit in smart_split(search_term):
        quoted = bit.startswith(('"', "'")) and len(bit) > 1 and bit[0] == bit[-1]
        if quoted:
            bit = unescape_string_literal(bit)
        bits.append((bit, quoted))
    return bits


def search_text(bits: list[tuple[str, bool]]) -> str:
    """The bits as one full-text query: words, and phrases in double quotes."""
    parts = []
    for bit, quoted in bits:
        words = bit.replace('"', " ").split()
        if quoted and len(words) > 1:
            parts.append(f'"{" ".join(words)}"')
        else:
            parts.extend(words)
    return " ".join(parts)


@dataclass(slots=True)
class RankedSearch:
    """What a changelist needs to rank a search that mixes full-text and other fields:
    the queryset before the search, and the full-text condition on the whole term."""

    base: models.QuerySet
    text: models.Q


class ZeroModelAdmin(admin.ModelAdmin):
    """A ``ModelAdmin`` for encrypted models (see the module doc)."""

    list_per_page = 50
    ordering = ("-pk",)
    show_full_result_count = True  # count() is served by the counted indexes
    # Rank full-text results (BM25) when no column is sorted.
    rank_search_results = True
    # A search of more words than this finds nothing (each word is a condition on every
    # search field: an OR of index scans, or a scan).
    max_search_words = 8
    too_many_words_message = "Search for at most {n} words at a time."

    # Shown when a save meets a concurrent change (OPTIONS["ISOLATION_LEVEL"] "repeatable
    # read" or "serializable"): nothing was saved, and the form is shown afresh.
    changed_meanwhile_message = (
        "This {name} was changed by someone else while you edited it, so your changes "
        "were not saved. Here it is as it is now: make your changes again."
    )

    def get_changelist(self, request, **kwargs):
        return ZeroChangeList

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        """Django's, except that a save that meets a concurrent change says so (and shows
        the row as it is now) instead of failing with a server error."""
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except SerializationError:
            return self.changed_meanwhile(request)

    def delete_view(self, request, object_id, extra_context=None):
        try:
            return super().delete_view(request, object_id, extra_context)
        except SerializationError:
            return self.changed_meanwhile(request)

    def changed_meanwhile(self, request) -> HttpResponseRedirect:
        """Tell the user their change lost a race, and send them back to the page."""
        name = self.opts.verbose_name
        self.message_user(request, self.changed_meanwhile_message.format(name=name), messages.ERROR)
        return HttpResponseRedirect(request.get_full_path())

    def search_lookups(self, request) -> list[SearchLookup]:
        """How each of ``get_search_fields()`` is searched."""
        return [search_lookup(self.model, spec) for spec in self.get_search_fields(request)]

    @property
    def search_help_text(self) -> str | None:  # a class attribute in a subclass wins
        if not self.search_fields or not is_encrypted(self.model):
            return None
        parts = [search_lookup(self.model, spec).describe() for spec in self.search_fields]
        return "Finds rows where " + ", or ".join(p[:1].lower() + p[1:] for p in parts) + "."

    def get_search_results(self, request, queryset, search_term):
        """Search ``queryset`` for ``search_term``, as Django does (each word must match
        one of the search fields) but with lookups the indexes serve (module doc).

        A ``@`` field gets the whole word or "quoted phrase" (the engine's full-text
        syntax). With a single ``@`` field and no column sorted, results come ranked: when
        it is the only search field, by the engine (the best BM25 match first); when other
        fields are searched too, the changelist lists the full-text matches first, in rank
        order, then the other matches in the admin's ordering.
        """
        if not search_term or not is_encrypted(queryset.model):
            return super().get_search_results(request, queryset, search_term)
        lookups = self.search_lookups(request)
        if not lookups:
            return queryset, False
        bits = search_bits(search_term)
        if not bits:
            return queryset, False
        if len(bits) > self.max_search_words:
            message = self.too_many_words_message.format(n=self.max_search_words)
            self.message_user(request, message, messages.WARNING)
            return queryset.none(), False
        term_queries = []
        for bit, quoted in bits:
            alternatives = []
            for lookup in lookups:
                value = lookup.value(bit, quoted)
                if value is not None:
                    alternatives.append(models.Q(**{lookup.orm_lookup: value}))
            if alternatives:
                term_queries.append(models.Q.create(alternatives, connector=models.Q.OR))
            else:
                term_queries.append(models.Q(pk__in=[]))  # this word can match nothing
        results = queryset.filter(models.Q.create(term_queries))
        may_have_duplicates = any(lookup_spawns_duplicates(self.opts, s.path) for s in lookups)

        text = [s for s in lookups if s.lookup == SEARCH]
        ranked = (
            self.rank_search_results
            and len(text) == 1
            and ORDER_VAR not in request.GET
            and not may_have_duplicates
        )
        if ranked:
            text_q = models.Q(**{text[0].orm_lookup: search_text(bits)})
            if len(lookups) == 1:
                results = queryset.filter(text_q).order_by()  # the engine ranks it
            else:
                results._zerodb_ranked_search = RankedSearch(queryset, text_q)
        return results, may_have_duplicates


class RankedResults(Sequence):
    """A changelist's results in rank order: the full-text matches of ``search`` (best
    first), then the rest of ``queryset`` in its own order. Pages are read by primary
    key (index-served); the matches' keys are read once."""

    def __init__(self, queryset: models.QuerySet, search: RankedSearch) -> None:
        self.queryset = queryset
        ranked = list(search.base.filter(search.text).order_by().values_list("pk", flat=True))
        # Keep only the matches the full search keeps (stop words, odd quoting).
        kept = set(queryset.filter(pk__in=ranked).values_list("pk", flat=True)) if ranked else ()
        self.ranked = [pk for pk in ranked if pk in kept]
        self.rest = queryset.exclude(pk__in=self.ranked) if self.ranked else queryset
        self._rest_count: int | None = None

    def count(self) -> int:
        if self._rest_count is None:
            self._rest_count = self.rest.count()
        return len(self.ranked) + self._rest_count

    def __len__(self) -> int:
        return self.count()

    def __getitem__(self, item):
        if isinstance(item, int):
            found = self[item : item + 1]
            if not found:
                raise IndexError(item)
            return found[0]
        start, stop, _ = item.indices(len(self))
        if stop <= start:
            return []
        n = len(self.ranked)
        page = self.ranked[start:stop]
        objects = []
        if page:
            by_pk = {obj.pk: obj for obj in self.queryset.filter(pk__in=page).order_by()}
            objects = [by_pk[pk] for pk in page if pk in by_pk]
        if stop > n:
            objects += list(self.rest[max(start - n, 0) : stop - n])
        return objects


class ZeroChangeList(ChangeList):
    """The changelist of :class:`ZeroModelAdmin`: index-friendly tie-breaking, and
    ranked results for a mixed full-text search."""

    def get_ordering(self, request, queryset):
        ordering = super().get_ordering(request, queryset)
        # Django appends "-pk" to make the order total (Django 5.2 and 6.0 may append it
        # twice, the second one changing nothing). After an ascending column, "pk" (same
        # direction) lets the engine page the column's index instead of sorting.
        head = list(ordering)
        while head and head[-1] == "-pk":
            head.pop()
        if (
            head
            and len(head) < len(ordering)
            and isinstance(head[0], str)
            and not head[0].startswith("-")
            and "-pk" not in head
        ):
            ordering = [*head, "pk"]
        return ordering

    def get_results(self, request):
        search = getattr(self.queryset, "_zerodb_ranked_search", None)
        if search is None or ORDER_VAR in self.params or self.list_editable:
            return super().get_results(request)
        results = RankedResults(self.queryset, search)
        paginator = self.model_admin.get_paginator(request, results, self.list_per_page)
        result_count = paginator.count
        full_result_count = (
            self.root_queryset.count() if self.model_admin.show_full_result_count else None
        )
        can_show_all = result_count <= self.list_max_show_all
        multi_page = result_count > self.list_per_page
        if (self.show_all and can_show_all) or not multi_page:
            result_list = results[:]
        else:
            try:
                result_list = paginator.page(self.page_num).object_list
            except InvalidPage:
                raise IncorrectLookupParameters from None
        self.result_count = result_count
        self.show_full_result_count = self.model_admin.show_full_result_count
        self.show_admin_actions = not self.show_full_result_count or bool(full_result_count)
        self.full_result_count = full_result_count
        self.result_list = result_list
        self.can_show_all = can_show_all
        self.multi_page = multi_page
        self.paginator = paginator
