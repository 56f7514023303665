"""``manage.py seed_hr --employees N``: fill the encrypted database with made-up staff.

Departments first (a dozen, unique names; existing ones are reused), then employees in
``bulk_create`` batches, each batch one transaction. Names, addresses and companies come
from Faker; titles, salaries and bios follow the department, so that filters and the
full-text search have something to find ("kubernetes", "payroll", "GDPR" ...). The same
``--seed`` gives the same data (with the same Faker version).
"""

from __future__ import annotations

import datetime
import decimal
import random
import time
import unicodedata

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from faker import Faker
from tqdm import tqdm

from django_zerodb.routers import encrypted_alias
from hr.models import Department, Employee

# name -> (weight: how many of the staff work there, salary band in dollars, titles from
# junior to senior, words for the bios)
DEPARTMENTS = {
    "Engineering": (
        12,
        (70_000, 210_000),
        ["Software Engineer", "Senior Software Engineer", "Staff Engineer", "Engineering Manager"],
        ["Python", "Django", "kubernetes", "PostgreSQL", "kernel", "compilers", "Rust", "APIs"],
    ),
    "Security": (
        3,
        (80_000, 220_000),
        ["Security Analyst", "Security Engineer", "Penetration Tester", "CISO"],
        ["cryptography", "incident response", "threat modeling", "audits", "TLS", "phishing"],
    ),
    "Data Science": (
        4,
        (75_000, 200_000),
        ["Data Analyst", "Data Scientist", "Machine Learning Engineer", "Head of Data"],
        ["statistics", "forecasting", "dashboards", "experiments", "SQL", "pandas"],
    ),
    "Product": (
        4,
        (70_000, 190_000),
        ["Associate Product Manager", "Product Manager", "Senior Product Manager", "VP Product"],
        ["roadmaps", "user research", "pricing", "onboarding", "analytics", "discovery"],
    ),
    "Design": (
        3,
        (60_000, 160_000),
        ["Junior Designer", "Product Designer", "Senior Designer", "Design Director"],
        ["typography", "accessibility", "prototyping", "illustration", "design systems"],
    ),
    "Sales": (
        10,
        (45_000, 180_000),
        ["Sales Development Rep", "Account Executive", "Senior Account Executive", "VP Sales"],
        ["negotiation", "enterprise deals", "CRM", "forecasting", "partnerships", "quotas"],
    ),
    "Marketing": (
        5,
        (50_000, 160_000),
        ["Marketing Coordinator", "Marketing Manager", "Growth Lead", "CMO"],
        ["campaigns", "SEO", "events", "branding", "newsletters", "social media"],
    ),
    "Customer Support": (
        8,
        (38_000, 110_000),
        ["Support Agent", "Support Specialist", "Support Team Lead", "Head of Support"],
        ["tickets", "escalations", "knowledge base", "onboarding", "troubleshooting"],
    ),
    "Finance": (
        4,
        (55_000, 190_000),
        ["Accountant", "Financial Analyst", "Controller", "CFO"],
        ["payroll", "budgeting", "audits", "invoicing", "tax", "quarterly reports"],
    ),
    "Human Resources": (
        3,
        (45_000, 150_000),
        ["HR Coordinator", "Recruiter", "HR Business Partner", "Chief People Officer"],
        ["recruiting", "payroll", "benefits", "onboarding", "training", "compensation"],
    ),
    "Legal": (
        2,
        (65_000, 230_000),
        ["Paralegal", "Counsel", "Senior Counsel", "General Counsel"],
        ["contracts", "GDPR", "compliance", "trademarks", "litigation", "privacy"],
    ),
    "Operations": (
        5,
        (40_000, 150_000),
        ["Operations Associate", "Operations Manager", "Facilities Manager", "COO"],
        ["logistics", "procurement", "facilities", "vendors", "travel", "office moves"],
    ),
}
HIRED_FROM = datetime.date(2006, 1, 1)
HIRED_TO = datetime.date(2025, 12, 31)
BATCH = 500


def ascii_slug(text: str) -> str:
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return "".join(c for c in text.lower() if c.isalnum())


class Command(BaseCommand):
    help = "Generate realistic made-up departments and employees in the encrypted database."

    def add_arguments(self, parser):
        parser.add_argument(
            "--employees", type=int, default=3000, help="how many (default: %(default)s)"
        )
        parser.add_argument(
            "--seed", type=int, default=None, help="random seed: the same seed, the same data"
        )
        parser.add_argument(
            "--if-empty", action="store_true", help="do nothing if there are employees already"
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=BATCH,
            help="employees per bulk_create transaction (default: %(default)s)",
        )

    def handle(self, *args, employees: int, seed, if_empty: bool, batch_size: int, **options):
        if employees < 0:
            raise CommandError("--employees must be 0 or more")
        if batch_size < 1:
            raise CommandError("--batch-size must be 1 or more")
        existing = Employee.objects.count()
        if if_empty and existing:
            self.stdout.write(f"{existing:,} employees already there: not seeding.")
            return
        started = time.perf_counter()
        rng = random.Random(seed)
        fake = Faker("en_US")
        fake.seed_instance(seed if seed is not None else rng.getrandbits(64))

        departments = self.departments(rng)
        emails = set(Employee.objects.values_list("email", flat=True)) if existing else set()
        stream = getattr(self.stderr, "_out", self.stderr)
        with tqdm(
            total=employees,
            unit=" employees",
            desc="seeding",
            file=stream,
            disable=not stream.isatty(),
            dynamic_ncols=True,
        ) as bar:
            done = 0
            while done < employees:
                size = min(batch_size, employees - done)
                batch = [self.employee(rng, fake, departments, emails) for _ in range(size)]
                with transaction.atomic(using=encrypted_alias()):
                    Employee.objects.bulk_create(batch)
                done += size
                bar.update(size)
        took = time.perf_counter() - started
        self.stdout.write(
            self.style.SUCCESS(
                f"Seeded {employees:,} employees in {len(departments)} departments "
                f"in {took:.1f}s ({existing + employees:,} employees in all)."
            )
        )

    def departments(self, rng: random.Random) -> list[tuple[Department, tuple]]:
        """The departments with their profiles; missing ones are created."""
        have = {d.name: d for d in Department.objects.all()}
        missing = [
            Department(
                name=name,
                budget=decimal.Decimal(rng.randrange(400, 9_000) * 1_000) + decimal.Decimal("0.00"),
            )
            for name in DEPARTMENTS
            if name not in have
        ]
        if missing:
            Department.objects.bulk_create(missing)
            have = {d.name: d for d in Department.objects.all()}
        return [(have[name], profile) for name, profile in DEPARTMENTS.items()]

    def employee(self, rng, fake, departments, emails: set[str]) -> Employee:
        weights = [profile[0] for _, profile in departments]
        department, (_, band, titles, topics) = rng.choices(departments, weights=weights)[0]
        first, last = fake.first_name(), fake.last_name()
        level = min(int(rng.triangular(0, len(titles), 0)), len(titles) - 1)
        low, high = band
        span = (high - low) / len(titles)
        salary = round(rng.uniform(low + span * level, low + span * (level + 1.4)), -2)
        hired = fake.date_between_dates(HIRED_FROM, HIRED_TO)
        email = self.email(first, last, emails, rng)
        skills = rng.sample(topics, 3)
        bio = (
            f"{first} joined {department.name} in {hired.year} as {titles[level]}, "
            f"after {rng.randint(1, 12)} years at {fake.company()}. "
            f"Works on {skills[0]}, {skills[1]} and {skills[2]}. "
            f"Lives in {fake.city()}. Motto: {fake.catch_phrase().lower()}."
        )
        return Employee(
            first_name=first,
            last_name=last,
            email=email,
            title=titles[level],
            salary=int(salary),
            department=department,
            hire_date=hired,
            is_active=rng.random() > 0.08,
            bio=bio,
        )

    @staticmethod
    def email(first: str, last: str, taken: set[str], rng: random.Random) -> str:
        local = f"{ascii_slug(first)}.{ascii_slug(last)}"
        email = f"{local}@example.com"
        while email in taken:
            email = f"{local}{rng.randint(2, 999)}@example.com"
        taken.add(email)
        return email
