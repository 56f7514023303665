"""The models the engine tests use (the Employee of ZeroDB's README)."""

from zerodb_core.models import Field, Model, Text


class Employee(Model):
    name = Field()
    surname = Field()
    salary = Field()
    description = Text()


class Account(Model):
    email = Field(unique=True)
    balance = Field()
