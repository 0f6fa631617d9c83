"""The package's shape, checked: layers import only downwards, no import cycles, only cli/
prints, modules and signatures stay small, imports sit at the top of modules.

Layers (docs/architecture.md): errors/atomic/paths at the base; config; telemetry; data (config);
train (config, data, telemetry); benchmark (telemetry); cli (everything).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "expert_cli"
ALLOWED = {
    "base": {"base"},
    "config": {"base", "config"},
    "telemetry": {"base", "telemetry"},
    "data": {"base", "config", "data"},
    "train": {"base", "config", "data", "telemetry", "train"},
    "benchmark": {"base", "telemetry", "benchmark"},
    "cli": {"base", "config", "data", "train", "telemetry", "benchmark", "cli"},
}
# imported where they are used because a run may not have them installed
OPTIONAL = (
    "liger_kernel",
    "triton",
    "flash_attn",
    "matplotlib",
    "tensorboard",
    "torch.utils.tensorboard",
    "transformers.integrations",
    "pynvml",
    "deepspeed",
)
MAX_LINES = 400
MAX_PARAMS = 6
PRINTERS = {"print", "Console", "Progress", "Live"}


def modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        out[name] = ast.parse(path.read_text(), filename=str(path))
    return out


def layer(module: str) -> str:
    if module == "expert_cli.__main__":  # `python -m expert_cli`: an entry point, as cli's
        return "cli"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else "base"


def imported(tree: ast.Module, module: str) -> list[tuple[str, bool]]:
    """(expert_cli module imported, whether at module level) for every import in `tree`."""
    found = []
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            # `from package import submodule` imports the submodule
            subs = [f"{node.module}.{a.name}" for a in node.names]
            names = [
                n
                for n in subs
                if (PACKAGE.parent / n.replace(".", "/")).with_suffix(".py").is_file()
            ] or [node.module]
        for name in names:
            if name.startswith("expert_cli"):
                found.append((name, id(node) in top))
    return found


def test_layers_import_only_downwards() -> None:
    bad = []
    for module, tree in modules().items():
        for name, _ in imported(tree, module):
            if name == "expert_cli":
                continue
            if layer(name) not in ALLOWED[layer(module)]:
                bad.append(f"{module} ({layer(module)}) imports {name} ({layer(name)})")
    assert not bad, "\n".join(bad)


def test_no_import_cycles() -> None:
    mods = modules()
    graph = {m: {n for n, _ in imported(t, m) if n in mods and n != m} for m, t in mods.items()}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(m: str, path: list[str]) -> bool:
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycle.extend(path[path.index(d) :] + [d] if d in path else [m, d])
                return True
            if d not in state and visit(d, path + [d]):
                return True
        state[m] = 2
        return False

    for m in sorted(graph):
        if m not in state and visit(m, [m]):
            break
    assert not cycle, " -> ".join(cycle)


def test_only_cli_prints() -> None:
    bad = []
    for module, tree in modules().items():
        if layer(module) == "cli":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                name = (
                    f.id
                    if isinstance(f, ast.Name)
                    else f.attr
                    if isinstance(f, ast.Attribute)
                    else None
                )
                if name in PRINTERS:
                    bad.append(f"{module}:{node.lineno} calls {name}")
    assert not bad, "\n".join(bad)


def test_modules_are_short() -> None:
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, long


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    return len([n for n in names if n not in ("self", "cls")])


def _kernel(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A Triton kernel: its parameters are what it is launched with (pointers, sizes,
    compile-time constants), not a Python interface."""
    return any(ast.unparse(d) == "triton.jit" for d in fn.decorator_list)


def test_functions_take_few_parameters() -> None:
    bad = []
    for module, tree in modules().items():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                and _params(node) > MAX_PARAMS
                and layer(module) != "cli"
                and not _kernel(node)
            ):
                bad.append(f"{module}.{node.name}: {_params(node)} parameters")
    assert not bad, "\n".join(bad)


def test_imports_are_at_the_top() -> None:
    """Inside functions only in cli/ command bodies (for a fast --help) and for optional
    dependencies."""
    bad = []
    for module, tree in modules().items():
        if layer(module) == "cli":
            continue
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in top:
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                )
                if not all(n.startswith(OPTIONAL) for n in names) and not _in_type_checking(
                    tree, node
                ):
                    bad.append(f"{module}:{node.lineno} imports {', '.join(names)}")
    assert not bad, f"{len(bad)} function-level imports:\n" + "\n".join(bad)


def _in_type_checking(tree: ast.Module, node: ast.AST) -> bool:
    for block in tree.body:
        if (
            isinstance(block, ast.If)
            and "TYPE_CHECKING" in ast.unparse(block.test)
            and any(n is node for n in ast.walk(block))
        ):
            return True
    return False


def test_the_architecture_doc_names_every_module() -> None:
    """docs/architecture.md matches the tree: every module is named there."""
    doc = (PACKAGE.parents[1] / "docs" / "architecture.md").read_text()
    missing = [
        str(p.relative_to(PACKAGE))
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.stem != "__init__" and f"`{p.stem}`" not in doc and f"{p.name}" not in doc
    ]
    assert not missing, missing
