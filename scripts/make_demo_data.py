"""Write the demo SQL expert's dataset: experts/demo/data/{train,valid,test}.jsonl.

Text-to-SQL examples generated from a handful of table schemas and question templates
(filters, joins, aggregates, group by/having, order by/limit, date ranges, subqueries). Each row
is `{"text": ...}`, already rendered in ChatML the way HiveLLM expert datasets are. The system
turn lists the tables a query needs plus a few unrelated ones, which varies the prompt length.

Deterministic (seeded) and stdlib only: `python scripts/make_demo_data.py`.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "experts" / "demo" / "data"
SEED = 20240601
TRAIN_SIZE = 400
VALID_SIZE = 40
TEST_SIZE = 40
MAX_TABLES = 6  # tables per prompt; keeps examples under about 600 tokens

# table -> column definitions, in CREATE TABLE order.
SCHEMAS: dict[str, list[str]] = {
    "customers": [
        "id SERIAL PRIMARY KEY",
        "first_name TEXT NOT NULL",
        "last_name TEXT NOT NULL",
        "email TEXT UNIQUE NOT NULL",
        "phone TEXT",
        "city TEXT",
        "country TEXT NOT NULL",
        "signup_date DATE NOT NULL",
        "is_active BOOLEAN NOT NULL DEFAULT TRUE",
    ],
    "orders": [
        "id SERIAL PRIMARY KEY",
        "customer_id INTEGER NOT NULL REFERENCES customers(id)",
        "order_date DATE NOT NULL",
        "status TEXT NOT NULL CHECK (status IN ('pending', 'paid', 'shipped', 'delivered', "
        "'cancelled'))",
        "shipping_country TEXT",
        "total_amount NUMERIC(12, 2) NOT NULL",
    ],
    "order_items": [
        "id SERIAL PRIMARY KEY",
        "order_id INTEGER NOT NULL REFERENCES orders(id)",
        "product_id INTEGER NOT NULL REFERENCES products(id)",
        "quantity INTEGER NOT NULL CHECK (quantity > 0)",
        "unit_price NUMERIC(10, 2) NOT NULL",
        "discount NUMERIC(4, 2) NOT NULL DEFAULT 0",
    ],
    "products": [
        "id SERIAL PRIMARY KEY",
        "name TEXT NOT NULL",
        "category_id INTEGER REFERENCES categories(id)",
        "supplier_id INTEGER REFERENCES suppliers(id)",
        "price NUMERIC(10, 2) NOT NULL",
        "stock_quantity INTEGER NOT NULL DEFAULT 0",
        "created_at TIMESTAMP NOT NULL DEFAULT now()",
        "discontinued BOOLEAN NOT NULL DEFAULT FALSE",
    ],
    "categories": [
        "id SERIAL PRIMARY KEY",
        "name TEXT UNIQUE NOT NULL",
        "parent_id INTEGER REFERENCES categories(id)",
    ],
    "suppliers": [
        "id SERIAL PRIMARY KEY",
        "company_name TEXT NOT NULL",
        "contact_email TEXT",
        "country TEXT NOT NULL",
        "rating SMALLINT CHECK (rating BETWEEN 1 AND 5)",
    ],
    "employees": [
        "id SERIAL PRIMARY KEY",
        "first_name TEXT NOT NULL",
        "last_name TEXT NOT NULL",
        "email TEXT UNIQUE NOT NULL",
        "department_id INTEGER REFERENCES departments(id)",
        "manager_id INTEGER REFERENCES employees(id)",
        "job_title TEXT NOT NULL",
        "salary NUMERIC(10, 2) NOT NULL",
        "hire_date DATE NOT NULL",
    ],
    "departments": [
        "id SERIAL PRIMARY KEY",
        "name TEXT UNIQUE NOT NULL",
        "location TEXT",
        "budget NUMERIC(14, 2)",
    ],
    "payments": [
        "id SERIAL PRIMARY KEY",
        "order_id INTEGER NOT NULL REFERENCES orders(id)",
        "paid_at TIMESTAMP NOT NULL",
        "amount NUMERIC(12, 2) NOT NULL",
        "method TEXT NOT NULL CHECK (method IN ('card', 'paypal', 'bank_transfer', 'voucher'))",
    ],
    "reviews": [
        "id SERIAL PRIMARY KEY",
        "product_id INTEGER NOT NULL REFERENCES products(id)",
        "customer_id INTEGER NOT NULL REFERENCES customers(id)",
        "rating SMALLINT NOT NULL CHECK (rating BETWEEN 1 AND 5)",
        "body TEXT",
        "created_at TIMESTAMP NOT NULL",
    ],
}

COUNTRIES = [
    "Germany",
    "France",
    "Brazil",
    "Japan",
    "Canada",
    "Spain",
    "India",
    "Mexico",
    "Italy",
    "Portugal",
    "Australia",
    "Kenya",
]
CITIES = [
    "Berlin",
    "Paris",
    "Lisbon",
    "Toronto",
    "Osaka",
    "Madrid",
    "Pune",
    "Nairobi",
    "Lyon",
    "Porto",
    "Sydney",
    "Monterrey",
]
STATUSES = ["pending", "paid", "shipped", "delivered", "cancelled"]
METHODS = ["card", "paypal", "bank_transfer", "voucher"]
CATEGORIES = ["Electronics", "Books", "Garden", "Toys", "Kitchen", "Sports", "Office"]
DEPARTMENTS = ["Engineering", "Sales", "Marketing", "Finance", "Support", "Operations"]
TITLES = [
    "Software Engineer",
    "Account Manager",
    "Data Analyst",
    "Support Specialist",
    "Product Manager",
    "Accountant",
]
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]

Example = tuple[str, str, list[str]]  # question, SQL, tables the query uses


def _pick(rng: random.Random, phrasings: list[str], **values: object) -> str:
    return rng.choice(phrasings).format(**values)


def customers_by_country(rng: random.Random) -> Example:
    country = rng.choice(COUNTRIES)
    q = _pick(
        rng,
        [
            "List the names and emails of all customers from {c}.",
            "Which customers live in {c}? Give their full name and email.",
            "Show first name, last name and email for customers whose country is {c}.",
        ],
        c=country,
    )
    sql = (
        f"SELECT first_name, last_name, email\nFROM customers\nWHERE country = '{country}'\n"
        "ORDER BY last_name, first_name;"
    )
    return q, sql, ["customers"]


def active_customers_in_city(rng: random.Random) -> Example:
    city = rng.choice(CITIES)
    year = rng.randint(2019, 2024)
    q = _pick(
        rng,
        [
            "How many active customers in {city} signed up since {y}?",
            "Count the active customers from {city} with a signup date in {y} or later.",
        ],
        city=city,
        y=year,
    )
    sql = (
        f"SELECT COUNT(*) AS active_customers\nFROM customers\nWHERE city = '{city}'\n"
        f"  AND is_active\n  AND signup_date >= DATE '{year}-01-01';"
    )
    return q, sql, ["customers"]


def products_above_price(rng: random.Random) -> Example:
    price = rng.choice([20, 50, 75, 100, 250, 500])
    q = _pick(
        rng,
        [
            "Which products cost more than ${p}? Most expensive first.",
            "List products priced above {p}, sorted by price descending.",
            "Show the name and price of every product over {p} dollars.",
        ],
        p=price,
    )
    sql = f"SELECT name, price\nFROM products\nWHERE price > {price}\nORDER BY price DESC;"
    return q, sql, ["products"]


def low_stock(rng: random.Random) -> Example:
    qty = rng.choice([5, 10, 20, 50])
    q = _pick(
        rng,
        [
            "Find products that are not discontinued and have fewer than {n} units in stock.",
            "Which active products are running low (stock under {n})?",
        ],
        n=qty,
    )
    sql = (
        f"SELECT id, name, stock_quantity\nFROM products\nWHERE NOT discontinued\n"
        f"  AND stock_quantity < {qty}\nORDER BY stock_quantity;"
    )
    return q, sql, ["products"]


def orders_with_customer(rng: random.Random) -> Example:
    year = rng.randint(2020, 2024)
    status = rng.choice(STATUSES)
    q = _pick(
        rng,
        [
            "Show each {s} order from {y} with the customer's full name.",
            "List order id, order date and customer name for {s} orders placed in {y}.",
        ],
        s=status,
        y=year,
    )
    sql = (
        "SELECT o.id, o.order_date, c.first_name || ' ' || c.last_name AS customer_name\n"
        "FROM orders o\nJOIN customers c ON c.id = o.customer_id\n"
        f"WHERE o.status = '{status}'\n  AND o.order_date >= DATE '{year}-01-01'\n"
        f"  AND o.order_date < DATE '{year + 1}-01-01'\nORDER BY o.order_date;"
    )
    return q, sql, ["orders", "customers"]


def count_by_status(rng: random.Random) -> Example:
    q = _pick(
        rng,
        [
            "How many orders are there in each status?",
            "Give the number of orders per status, largest group first.",
            "Break down the order count by status.",
        ],
    )
    sql = (
        "SELECT status, COUNT(*) AS order_count\nFROM orders\nGROUP BY status\n"
        "ORDER BY order_count DESC;"
    )
    return q, sql, ["orders"]


def frequent_customers(rng: random.Random) -> Example:
    n = rng.choice([3, 5, 10, 20])
    q = _pick(
        rng,
        [
            "Which customers have placed more than {n} orders?",
            "Find customers with over {n} orders and show how many each has.",
        ],
        n=n,
    )
    sql = (
        "SELECT c.id, c.first_name, c.last_name, COUNT(o.id) AS order_count\n"
        "FROM customers c\nJOIN orders o ON o.customer_id = c.id\n"
        "GROUP BY c.id, c.first_name, c.last_name\n"
        f"HAVING COUNT(o.id) > {n}\nORDER BY order_count DESC;"
    )
    return q, sql, ["customers", "orders"]


def top_products_by_revenue(rng: random.Random) -> Example:
    k = rng.choice([3, 5, 10])
    year = rng.randint(2021, 2024)
    q = _pick(
        rng,
        [
            "What are the top {k} products by revenue in {y}?",
            "List the {k} best-selling products of {y} by total sales amount.",
        ],
        k=k,
        y=year,
    )
    sql = (
        "SELECT p.id, p.name,\n"
        "       SUM(oi.quantity * oi.unit_price * (1 - oi.discount)) AS revenue\n"
        "FROM order_items oi\nJOIN orders o ON o.id = oi.order_id\n"
        "JOIN products p ON p.id = oi.product_id\n"
        f"WHERE o.order_date >= DATE '{year}-01-01'\n"
        f"  AND o.order_date < DATE '{year + 1}-01-01'\n"
        "  AND o.status <> 'cancelled'\n"
        f"GROUP BY p.id, p.name\nORDER BY revenue DESC\nLIMIT {k};"
    )
    return q, sql, ["order_items", "orders", "products"]


def monthly_revenue(rng: random.Random) -> Example:
    year = rng.randint(2020, 2024)
    q = _pick(
        rng,
        [
            "Show total order revenue per month for {y}.",
            "What was the monthly sales total in {y}?",
        ],
        y=year,
    )
    sql = (
        "SELECT date_trunc('month', order_date) AS month, SUM(total_amount) AS revenue\n"
        f"FROM orders\nWHERE order_date >= DATE '{year}-01-01'\n"
        f"  AND order_date < DATE '{year + 1}-01-01'\n  AND status <> 'cancelled'\n"
        "GROUP BY month\nORDER BY month;"
    )
    return q, sql, ["orders"]


def orders_in_month(rng: random.Random) -> Example:
    year = rng.randint(2020, 2024)
    month = rng.randint(1, 12)
    nxt_year, nxt_month = (year + 1, 1) if month == 12 else (year, month + 1)
    q = _pick(
        rng,
        [
            "How many orders were placed in {m} {y}, and what was their total value?",
            "Give the order count and total amount for {m} {y}.",
        ],
        m=MONTHS[month - 1],
        y=year,
    )
    sql = (
        "SELECT COUNT(*) AS order_count, SUM(total_amount) AS total_value\nFROM orders\n"
        f"WHERE order_date >= DATE '{year}-{month:02d}-01'\n"
        f"  AND order_date < DATE '{nxt_year}-{nxt_month:02d}-01';"
    )
    return q, sql, ["orders"]


def salary_above_department_avg(rng: random.Random) -> Example:
    q = _pick(
        rng,
        [
            "Which employees earn more than the average salary of their department?",
            "List employees paid above their department's average salary.",
        ],
    )
    sql = (
        "SELECT e.first_name, e.last_name, e.salary, d.name AS department\n"
        "FROM employees e\nJOIN departments d ON d.id = e.department_id\n"
        "WHERE e.salary > (\n    SELECT AVG(e2.salary)\n    FROM employees e2\n"
        "    WHERE e2.department_id = e.department_id\n)\nORDER BY d.name, e.salary DESC;"
    )
    return q, sql, ["employees", "departments"]


def avg_salary_per_department(rng: random.Random) -> Example:
    n = rng.choice([2, 5, 10])
    q = _pick(
        rng,
        [
            "What is the average salary in each department with at least {n} employees?",
            "For departments with {n} or more staff, show the headcount and average salary.",
        ],
        n=n,
    )
    sql = (
        "SELECT d.name, COUNT(*) AS headcount, ROUND(AVG(e.salary), 2) AS avg_salary\n"
        "FROM departments d\nJOIN employees e ON e.department_id = d.id\n"
        f"GROUP BY d.name\nHAVING COUNT(*) >= {n}\nORDER BY avg_salary DESC;"
    )
    return q, sql, ["departments", "employees"]


def hired_between(rng: random.Random) -> Example:
    year = rng.randint(2015, 2023)
    dept = rng.choice(DEPARTMENTS)
    q = _pick(
        rng,
        [
            "Who joined the {d} department between {y} and {y2}?",
            "List {d} employees hired from the start of {y} to the end of {y2}.",
        ],
        d=dept,
        y=year,
        y2=year + 1,
    )
    sql = (
        "SELECT e.first_name, e.last_name, e.hire_date\nFROM employees e\n"
        "JOIN departments d ON d.id = e.department_id\n"
        f"WHERE d.name = '{dept}'\n"
        f"  AND e.hire_date BETWEEN DATE '{year}-01-01' AND DATE '{year + 1}-12-31'\n"
        "ORDER BY e.hire_date;"
    )
    return q, sql, ["employees", "departments"]


def employees_with_manager(rng: random.Random) -> Example:
    title = rng.choice(TITLES)
    q = _pick(
        rng,
        [
            "Show every {t} together with the name of their manager.",
            "List employees with job title '{t}' and who they report to.",
        ],
        t=title,
    )
    sql = (
        "SELECT e.first_name || ' ' || e.last_name AS employee,\n"
        "       m.first_name || ' ' || m.last_name AS manager\n"
        "FROM employees e\nLEFT JOIN employees m ON m.id = e.manager_id\n"
        f"WHERE e.job_title = '{title}'\nORDER BY employee;"
    )
    return q, sql, ["employees"]


def customers_without_orders(rng: random.Random) -> Example:
    q = _pick(
        rng,
        [
            "Which customers have never placed an order?",
            "Find customers with no orders at all.",
            "List the emails of customers who have not ordered anything yet.",
        ],
    )
    sql = (
        "SELECT c.id, c.email\nFROM customers c\nLEFT JOIN orders o ON o.customer_id = c.id\n"
        "WHERE o.id IS NULL;"
    )
    return q, sql, ["customers", "orders"]


def products_never_ordered(rng: random.Random) -> Example:
    cat = rng.choice(CATEGORIES)
    q = _pick(
        rng,
        [
            "Which {c} products have never been ordered?",
            "Find products in the {c} category that do not appear in any order.",
        ],
        c=cat,
    )
    sql = (
        "SELECT p.id, p.name\nFROM products p\nJOIN categories cat ON cat.id = p.category_id\n"
        f"WHERE cat.name = '{cat}'\n  AND NOT EXISTS (\n      SELECT 1\n"
        "      FROM order_items oi\n      WHERE oi.product_id = p.id\n  );"
    )
    return q, sql, ["products", "categories", "order_items"]


def payments_by_method(rng: random.Random) -> Example:
    year = rng.randint(2021, 2024)
    q = _pick(
        rng,
        [
            "How much was paid with each payment method in {y}?",
            "Total payment amount per method for {y}, highest first.",
        ],
        y=year,
    )
    sql = (
        "SELECT method, COUNT(*) AS payments, SUM(amount) AS total_paid\nFROM payments\n"
        f"WHERE paid_at >= TIMESTAMP '{year}-01-01 00:00:00'\n"
        f"  AND paid_at < TIMESTAMP '{year + 1}-01-01 00:00:00'\n"
        "GROUP BY method\nORDER BY total_paid DESC;"
    )
    return q, sql, ["payments"]


def unpaid_orders(rng: random.Random) -> Example:
    method = rng.choice(METHODS)
    q = _pick(
        rng,
        [
            "Which orders were paid by {m} but for less than their total amount?",
            "Find orders partially paid with {m}: the sum of {m} payments is below the order "
            "total.",
        ],
        m=method,
    )
    sql = (
        "SELECT o.id, o.total_amount, SUM(p.amount) AS paid\nFROM orders o\n"
        "JOIN payments p ON p.order_id = o.id\n"
        f"WHERE p.method = '{method}'\nGROUP BY o.id, o.total_amount\n"
        "HAVING SUM(p.amount) < o.total_amount;"
    )
    return q, sql, ["orders", "payments"]


def suppliers_product_count(rng: random.Random) -> Example:
    country = rng.choice(COUNTRIES)
    q = _pick(
        rng,
        [
            "How many products does each supplier from {c} provide?",
            "For suppliers based in {c}, count their products.",
        ],
        c=country,
    )
    sql = (
        "SELECT s.company_name, COUNT(p.id) AS product_count\nFROM suppliers s\n"
        "LEFT JOIN products p ON p.supplier_id = s.id\n"
        f"WHERE s.country = '{country}'\nGROUP BY s.company_name\n"
        "ORDER BY product_count DESC;"
    )
    return q, sql, ["suppliers", "products"]


def best_rated_products(rng: random.Random) -> Example:
    n = rng.choice([5, 10, 25])
    k = rng.choice([5, 10])
    q = _pick(
        rng,
        [
            "What are the {k} highest-rated products with at least {n} reviews?",
            "Top {k} products by average review rating, counting only those with {n}+ reviews.",
        ],
        k=k,
        n=n,
    )
    sql = (
        "SELECT p.name, ROUND(AVG(r.rating), 2) AS avg_rating, COUNT(*) AS reviews\n"
        "FROM reviews r\nJOIN products p ON p.id = r.product_id\nGROUP BY p.name\n"
        f"HAVING COUNT(*) >= {n}\nORDER BY avg_rating DESC, reviews DESC\nLIMIT {k};"
    )
    return q, sql, ["reviews", "products"]


def category_revenue_share(rng: random.Random) -> Example:
    year = rng.randint(2021, 2024)
    q = _pick(
        rng,
        [
            "What share of {y} revenue did each product category bring in?",
            "Show revenue by category for {y} and each category's percentage of the total.",
        ],
        y=year,
    )
    sql = (
        "WITH category_revenue AS (\n"
        "    SELECT cat.name AS category, SUM(oi.quantity * oi.unit_price) AS revenue\n"
        "    FROM order_items oi\n    JOIN orders o ON o.id = oi.order_id\n"
        "    JOIN products p ON p.id = oi.product_id\n"
        "    JOIN categories cat ON cat.id = p.category_id\n"
        f"    WHERE o.order_date >= DATE '{year}-01-01'\n"
        f"      AND o.order_date < DATE '{year + 1}-01-01'\n"
        "    GROUP BY cat.name\n)\n"
        "SELECT category, revenue,\n"
        "       ROUND(100.0 * revenue / SUM(revenue) OVER (), 1) AS pct_of_total\n"
        "FROM category_revenue\nORDER BY revenue DESC;"
    )
    return q, sql, ["order_items", "orders", "products", "categories"]


def latest_order_per_customer(rng: random.Random) -> Example:
    country = rng.choice(COUNTRIES)
    q = _pick(
        rng,
        [
            "For each customer in {c}, show the date of their most recent order.",
            "When did each {c} customer last order?",
        ],
        c=country,
    )
    sql = (
        "SELECT c.id, c.first_name, c.last_name, MAX(o.order_date) AS last_order\n"
        "FROM customers c\nJOIN orders o ON o.customer_id = c.id\n"
        f"WHERE c.country = '{country}'\nGROUP BY c.id, c.first_name, c.last_name\n"
        "ORDER BY last_order DESC;"
    )
    return q, sql, ["customers", "orders"]


def top_level_categories(rng: random.Random) -> Example:
    q = _pick(
        rng,
        [
            "List the top-level categories.",
            "Which categories have no parent category?",
            "Show all root categories alphabetically.",
        ],
    )
    sql = "SELECT id, name\nFROM categories\nWHERE parent_id IS NULL\nORDER BY name;"
    return q, sql, ["categories"]


def departments_by_budget(rng: random.Random) -> Example:
    budget = rng.choice([100_000, 250_000, 500_000, 1_000_000])
    q = _pick(
        rng,
        [
            "Which departments have a budget over {b}?",
            "Departments with budget above {b}, biggest first.",
        ],
        b=f"{budget:,}",
    )
    sql = (
        f"SELECT name, location, budget\nFROM departments\nWHERE budget > {budget}\n"
        "ORDER BY budget DESC;"
    )
    return q, sql, ["departments"]


TEMPLATES: list[Callable[[random.Random], Example]] = [
    customers_by_country,
    active_customers_in_city,
    products_above_price,
    low_stock,
    orders_with_customer,
    count_by_status,
    frequent_customers,
    top_products_by_revenue,
    monthly_revenue,
    orders_in_month,
    salary_above_department_avg,
    avg_salary_per_department,
    hired_between,
    employees_with_manager,
    customers_without_orders,
    products_never_ordered,
    payments_by_method,
    unpaid_orders,
    suppliers_product_count,
    best_rated_products,
    category_revenue_share,
    latest_order_per_customer,
    top_level_categories,
    departments_by_budget,
]


def create_table(name: str) -> str:
    """The CREATE TABLE statement of one schema table."""
    columns = ",\n".join(f"    {col}" for col in SCHEMAS[name])
    return f"CREATE TABLE {name} (\n{columns}\n);"


def render(question: str, sql: str, tables: list[str]) -> str:
    """One example in ChatML, as HiveLLM expert datasets store it."""
    schema = "\n".join(create_table(t) for t in tables)
    return (
        f"<|im_start|>system\nDialect: postgres\nTables:\n{schema}\n<|im_end|>\n"
        f"<|im_start|>user\n{question}<|im_end|>\n"
        f"<|im_start|>assistant\n{sql}<|im_end|>\n"
    )


def make_example(rng: random.Random) -> str:
    """A random template, its tables plus up to 4 unrelated ones (at most MAX_TABLES in all)."""
    question, sql, needed = rng.choice(TEMPLATES)(rng)
    others = [t for t in SCHEMAS if t not in needed]
    n_extra = min(rng.choice([0, 0, 0, 1, 1, 2, 3, 4]), MAX_TABLES - len(needed))
    extra = rng.sample(others, n_extra)
    tables = needed + extra
    rng.shuffle(tables)
    return render(question, sql, tables)


def make_split(rng: random.Random, size: int, exclude: set[str]) -> list[str]:
    """`size` distinct examples not in `exclude`."""
    rows: list[str] = []
    seen = set(exclude)
    while len(rows) < size:
        text = make_example(rng)
        if text not in seen:
            seen.add(text)
            rows.append(text)
    return rows


def write_jsonl(path: Path, texts: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for text in texts:
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    tmp.replace(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    rng = random.Random(SEED)
    train = make_split(rng, TRAIN_SIZE, set())
    valid = make_split(rng, VALID_SIZE, set(train))
    test = make_split(rng, TEST_SIZE, set(train) | set(valid))  # drawn after: the others stay
    write_jsonl(args.out / "train.jsonl", train)
    write_jsonl(args.out / "valid.jsonl", valid)
    write_jsonl(args.out / "test.jsonl", test)
    print(
        f"wrote {len(train)} train, {len(valid)} valid and {len(test)} test examples to {args.out}"
    )


if __name__ == "__main__":
    main()
