"""Models of the native API: plain Python classes whose declared fields are indexed.

``Field()`` keeps an ordered index (equality, ranges, ``in``, prefixes, ordering),
``Field(unique=True)`` a unique one, ``Text()`` a full-text index. Attributes that are not
declared are stored with the record but not indexed. Objects get an integer ``pk`` from
the store's id counter when they are added.
"""

from __future__ import annotations

from typing import Any, ClassVar

from zerodb_core.schema import FIELD, TEXT, TRIGRAM, UNIQUE, IndexSpec, ModelSpec


class Field:
    """An indexed attribute."""

    kind = FIELD

    def __init__(self, *, unique: bool = False, index: bool = True) -> None:
        self.unique = unique
        self.index = index
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return obj.__dict__.get(self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[self.name] = value

    def index_spec(self) -> IndexSpec | None:
        if not self.index:
            return None
        return IndexSpec(self.name, UNIQUE if self.unique else self.kind, (self.name,))


class Text(Field):
    """A text attribute with a full-text index (``Contains`` queries, BM25 ranking)."""

    kind = TEXT

    def __init__(self) -> None:
        super().__init__()

    def index_spec(self) -> IndexSpec:
        return IndexSpec(self.name, self.kind, (self.name,))


class Trigram(Text):
    """A text attribute with a trigram index (``Substring`` queries, in any case)."""

    kind = TRIGRAM


class Model:
    """Base class of stored objects.

    Subclasses declare :class:`Field` and :class:`Text` attributes. The name the data is
    kept under defaults to the class name; set ``zerodb_name`` to choose another (it never
    leaves the client: the catalog is encrypted).
    """

    zerodb_name: ClassVar[str] = ""
    _fields: ClassVar[dict[str, Field]] = {}
    _plain_fields: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "zerodb_name" not in cls.__dict__:
            cls.zerodb_name = cls.__name__
        fields: dict[str, Field] = {}
        for klass in reversed(cls.__mro__):
            fields.update({k: v for k, v in vars(klass).items() if isinstance(v, Field)})
        cls._fields = fields
        # Fields that assigning stores in the instance dict under their own name (what
        # Field.__set__ does), unless a subclass or __setattr__ changed that: __init__
        # stores these directly, without a descriptor call per attribute.
        plain = set()
        if cls.__setattr__ is object.__setattr__:
            for name, field in fields.items():
                attr = next((vars(k)[name] for k in cls.__mro__ if name in vars(k)), None)
                if attr is field and type(field).__set__ is Field.__set__ and field.name == name:
                    plain.add(name)
        cls._plain_fields = frozenset(plain)

    def __init__(self, **attrs: Any) -> None:
        self.pk: Any = None
        plain = self._plain_fields
        stored = self.__dict__
        for name, value in attrs.items():
            if name in plain:
                stored[name] = value
            else:
                setattr(self, name, value)

    @classmethod
    def model_spec(cls) -> ModelSpec:
        specs = [f.index_spec() for f in cls._fields.values()]
        return ModelSpec(cls.zerodb_name, {s.name: s for s in specs if s is not None})

    def to_record(self) -> dict[str, Any]:
        """The stored fields: every public attribute except ``pk``."""
        return {k: v for k, v in self.__dict__.items() if k[:1] != "_" and k != "pk"}

    @classmethod
    def from_record(cls, pk: Any, fields: dict[str, Any]) -> Model:
        obj = cls.__new__(cls)
        obj.__dict__.update(fields)
        obj.pk = pk
        return obj

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in list(self.to_record().items())[:4])
        return f"<{type(self).__name__} pk={self.pk!r} {shown}>"
