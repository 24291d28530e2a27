"""The documentation site (docs/): it builds from scratch with Sphinx, warnings as errors
(``sphinx-build -W``), and what it says stays tied to the code and the result files:

* every name in ``pnex_magic.__all__`` is in the API reference;
* every table of measured results is generated from ``benchmarks/results/*.json`` at build time,
  names its GPU (or that it had none) and its date, and holds that file's figures; no page types
  such a table by hand;
* the notebooks are rendered from their saved outputs, with the ``%%pnex`` reports' CSS tabs
  (``<style>`` and radio inputs kept);
* the commands of the Getting started page are the README's (which .ci/run runs);
* the screenshots the pages show are the ones tests/test_browser.py takes;
* the docstring examples of the public API run (doctest).

Skipped, with the reason, where the ``docs`` extra is not installed; the README's test command
installs it, so CI runs these.  The code blocks of the pages run in tests/test_doc_code.py.
"""

from __future__ import annotations

import doctest
import html
import json
import re
import sys

import pytest

from docs_support import DOC_SCREENSHOTS, DOCS, REPO, SCREENSHOTS, build_docs, code_blocks, missing, pages

_WHY = missing()
needs_docs = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")

sys.path.insert(0, str(DOCS / "_ext"))


@pytest.fixture(scope="module")
def site():
    if _WHY:
        pytest.skip(_WHY)
    return build_docs()


def _results_directives() -> list[tuple[str, str, str | None]]:
    """(page, file, table) of every {pnex-results} directive in the docs."""
    found = []
    for page in sorted(DOCS.glob("*.md")):
        for m in re.finditer(r"^```\{pnex-results\} (\S+)\n(?::table: (\S+)\n)?", page.read_text(), re.MULTILINE):
            found.append((page.name, m.group(1), m.group(2)))
    return found


@needs_docs
def test_docs_build_with_warnings_as_errors(site):
    print(f"sphinx-build -W took {site.seconds:.1f} s")
    for page in ("index", "getting-started", "magic", "kernels", "porting", "performance", "debugging",
                 "gradients", "jax", "shipping", "how-it-works", "results", "api", "changelog", "about",
                 "examples", "notebooks/01_quickstart", "notebooks/06_jax", "notebooks/07_tensor_cores"):
        assert (site.html / f"{page}.html").is_file(), page


@needs_docs
def test_every_public_name_is_in_the_api_reference(site):
    import pnex_magic

    api = (site.html / "api.html").read_text()
    missing_names = [name for name in pnex_magic.__all__
                     if f'id="pnex_magic.{name}"' not in api and f'id="module-pnex_magic.{name}"' not in api]
    assert not missing_names, f"not in the API reference: {missing_names}"


def test_every_results_table_names_its_gpu_and_date():
    import pnex_results

    directives = _results_directives()
    assert len(directives) >= 30, directives
    for page, name, table in directives:
        caption, header, rows = pnex_results.render(name, table)
        assert rows and all(len(r) == len(header) for r in rows), (page, name, table)
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", caption), (page, caption)
        gpu = pnex_results.device(pnex_results.load(name))
        assert re.match(r"NVIDIA |no GPU", gpu) and caption.startswith(gpu), (page, caption)
        assert f"benchmarks/results/{name}" in caption


def test_results_tables_hold_their_files_figures():
    """Independent of the extension's formatting code: figures recomputed from the JSON."""
    import pnex_results

    d = json.loads((REPO / "benchmarks/results/derived-backward-2026-11-26-0256.json").read_text())
    caption, header, rows = pnex_results.render("derived-backward-2026-11-26-0256.json")
    assert "NVIDIA H200" in caption and "2026-11-26 02:56 UTC" in caption
    for row, r in zip(rows, d["rows"], strict=True):
        s = r["seconds"]
        base = s.get("hand-written backward") or s["forward"]
        assert row[0] == r["workload"] and row[5].startswith(f'{s["derived backward"] / base:.2f}×'), row
    d = json.loads((REPO / "benchmarks/results/doc-examples-2026-11-25-2321.json").read_text())
    _, _, rows = pnex_results.render("doc-examples-2026-11-25-2321.json")
    assert [r[0] for r in rows] == [p["port"] for p in d["ports"]]
    assert all(r[1] == ("yes" if p["works"] else "no") for r, p in zip(rows, d["ports"]))
    with pytest.raises(ValueError, match="no result file"):
        pnex_results.render("no-such-2026-01-01.json")
    with pytest.raises(ValueError, match="has the tables"):
        pnex_results.render("grid-random-2026-11-26-0041.json", "no_such_table")


def test_tensor_core_and_profile_tables_hold_their_files_figures():
    """The tensor-cores and profile-check tables, their ratios recomputed from the JSON."""
    import pnex_results

    def load(name):
        return json.loads((REPO / "benchmarks/results" / name).read_text())

    d = load("tensor-cores-2026-11-27-1350.json")
    caption, header, rows = pnex_results.render("tensor-cores-2026-11-27-1350.json", "gemm")
    assert caption.startswith("NVIDIA H200 (driver 580.159.04), 2026-11-27 13:47 UTC"), caption
    for row, r in zip(rows, d["gemm"], strict=True):
        assert row[:4] == [r["dtype"], str(r["m"]), str(r["n"]), str(r["k"])]
        assert abs(float(row[4]) - r["pnex_tflops"]) < 0.06 and abs(float(row[5]) - r["cublas_tflops"]) < 0.06, row
        assert row[7] == f'{r["pnex_tflops"] / r["cublas_tflops"]:.2f}×' and row[8] == r["pnex_kernel"], row
    _, _, rows = pnex_results.render("tensor-cores-2026-11-27-1350.json", "epilogue")
    for row, r in zip(rows, d["epilogue"], strict=True):
        assert row[4] == "–"  # a file from before the TMA kernel's GELU epilogue
        assert row[7] == f'{r["eager_us"] / r["pnex_us"]:.2f}×' and row[8] == f'{r["compile_us"] / r["pnex_us"]:.2f}×'
    with pytest.raises(ValueError, match="cannot be made from this file"):
        pnex_results.render("tensor-cores-2026-11-27-1350.json", "attention")  # that run had no attention rows
    d = load("tensor-cores-2026-11-27-1344.json")
    _, _, rows = pnex_results.render("tensor-cores-2026-11-27-1344.json", "attention")
    for row, r in zip(rows, d["attention"], strict=True):
        assert row[3] == str(r["head_dim"]) and row[4] == ("yes" if r["causal"] else "no")
        assert row[7] == f'{r["pnex_tflops"] / r["sdpa_tflops"]:.2f}×', row
    _, _, rows = pnex_results.render("tensor-cores-2026-11-27-1344.json", "gemm")
    assert all(r[8] == "mma:128x128x3 (2 of 3 variants not timed)" for r in rows), rows  # the wgmma launches failed
    header, rows = pnex_results.TABLES["tensor-cores"]["profiles"]({"profiles": [
        {"kernel": "k1", "tensor_pipe": 0.61, "compute_sol": 0.7, "memory_sol": 0.25, "dram_sol": 0.1,
         "achieved_occupancy": 0.12, "stalls": [["gmma", 0.4], ["barrier", 0.2]]},
        {"kernel": "k2", "error": "ProfilerUnavailable: no ncu"}]})
    assert rows[0] == ["k1", "61%", "70%", "25%", "10%", "12%", "gmma (40%)"]
    assert rows[1][0] == "k2" and rows[1][-1] == "not profiled: ProfilerUnavailable: no ncu"
    d = load("profile-check-2026-11-27-1353.json")
    _, _, rows = pnex_results.render("profile-check-2026-11-27-1353.json", "profiles")
    for row, r in zip(rows, d["profiles"], strict=True):
        assert row[0] == r["kernel"] and row[2] == f'{r["memory_sol"]:.0%}' and row[3] == f'{r["compute_sol"]:.0%}'
        assert row[5].startswith(r["stalls"][0][0]) and r["hot_lines"][0][3] in row[6], row
    _, _, rows = pnex_results.render("profile-check-2026-11-27-1353.json", "roofline")
    roof = d["roofline"]
    assert dict(rows)["its share of that peak"] == f'{roof["bf16_matmul_tflops"] / roof["fp16_tc_peak_tflops"]:.0%}'


def test_epilogue_pairs_tables_hold_their_files_figures():
    """The interleaved fused-epilogue table: each contender's median and, for a fused one, its
    paired cost over its own product, from the contender's ``product`` where the file has it
    (a made-up name with ``_over_`` in it stays whole), from the row's keys in older files."""
    import pnex_results

    name = "epilogue-pairs-2026-11-29-0803.json"
    d = json.loads((REPO / "benchmarks/results" / name).read_text())
    caption, _, rows = pnex_results.render(name)
    assert caption.startswith("NVIDIA H200"), caption
    by = {(row[0], row[1]): row for row in rows}
    for r in d["rows"]:
        shape = f'{r["m"]}×{r["n"]}×{r["k"]}'
        gelu = by[(shape, "persistent_gelu_poly")]
        assert gelu[2] == pnex_results.us(r["contenders"]["persistent_gelu_poly"]["us"])
        assert gelu[4] == f'+{pnex_results.us(r["persistent_gelu_poly_over_persistent_us"])} over persistent', gelu
        assert by[(shape, "persistent")][4] == "–"
        assert gelu[5] == f'{r["contenders"]["eager"]["us"] / r["contenders"]["persistent_gelu_poly"]["us"]:.2f}×'
    made = {"rows": [{"m": 1, "n": 2, "k": 3, "contenders": {
        "a_over_b": {"us": 10.0, "us_q1": 9.0, "us_q3": 11.0},
        "a_over_b_gelu": {"us": 12.0, "us_q1": 11.0, "us_q3": 13.0, "product": "a_over_b", "over_product_us": 2.0}}}]}
    _, rows = pnex_results.TABLES["epilogue-pairs"]["rows"](made)
    assert [row[4] for row in rows] == ["–", f"+{pnex_results.us(2.0)} over a_over_b"], rows


@needs_docs
def test_built_pages_show_the_generated_tables(site):
    import pnex_results

    for page, name, table in _results_directives():
        built = html.unescape((site.html / page.replace(".md", ".html")).read_text())
        caption, _, rows = pnex_results.render(name, table)
        assert caption in built, (page, caption)
        for row in rows:
            for cell in row:
                assert cell in built, (page, name, cell)


_MEASURED = re.compile(r"\d[\d.,]*\s*(µs|us\b|ms\b|s\b|×|TB/s|GB/s|%)")


def test_no_page_types_a_table_of_figures():
    """Tables of measured figures come from result files (the {pnex-results} directive)."""
    typed = []
    for page in pages():
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if line.lstrip().startswith("|") and _MEASURED.search(line):
                typed.append(f"{page.relative_to(REPO)}:{n}: {line.strip()[:100]}")
    assert not typed, "tables of figures typed by hand:\n" + "\n".join(typed)


def test_getting_started_commands_are_the_readmes():
    readme = [b.code.strip() for b in code_blocks(REPO / "README.md") if b.language == "bash"]
    started = [b.code.strip() for b in code_blocks(DOCS / "getting-started.md") if b.language == "bash"]
    assert len(started) >= 2 and started[:2] == readme[:2], (started[:2], readme[:2])
    assert all(c.startswith("python3 -m venv .venv && ") for c in started[:2])
    assert 'pip install -e ".[cu13,test,sass,docs]"' in started[1], "the test command installs the docs extra"


def test_the_screenshots_are_the_browser_tests():
    shown = set()
    for page in pages():
        shown |= set(re.findall(r"_static/screenshots/([\w.-]+\.png)", page.read_text()))
    assert shown, "no page shows a screenshot"
    assert shown <= set(DOC_SCREENSHOTS), shown - set(DOC_SCREENSHOTS)
    on_disk = {p.name for p in SCREENSHOTS.glob("*.png")}
    assert on_disk == set(DOC_SCREENSHOTS), on_disk ^ set(DOC_SCREENSHOTS)
    for name in on_disk:
        assert (SCREENSHOTS / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert len((REPO / "README.md").read_text().splitlines()) <= 250, "README.md fits on a screen"


@needs_docs
def test_notebooks_are_rendered_from_their_saved_outputs_with_working_tabs(site):
    for nb_path in sorted((REPO / "notebooks").glob("*.ipynb")):
        page = (site.html / "notebooks" / f"{nb_path.stem}.html").read_text()
        nb = json.loads(nb_path.read_text())
        run = nb["metadata"].get("pnex_run")
        assert run, (f"{nb_path.name} has no saved GPU run to render (no pnex_run metadata): "
                     f"python benchmarks/run_notebooks.py notebooks/{nb_path.name} on the GPU machine")
        device = run["device"]
        reports = sum("pnex-report" in "".join(o.get("data", {}).get("text/html", ""))
                      for c in nb["cells"] for o in c.get("outputs", []))
        assert len(re.findall(r'class="pnex-report\b', page)) >= reports, nb_path.name
        if reports:
            assert "<style>" in page and 'type="radio"' in page and ".pnex-tabs:has(" in page, nb_path.name
            assert device.split(" (")[0] in page, (nb_path.name, device)  # the saved GPU run, not a re-run


PUBLIC_DOCTESTS = ("jit", "attach_backward", "derive_backward", "load")


@pytest.mark.parametrize("name", PUBLIC_DOCTESTS)
def test_docstring_examples_run(name):
    import pnex_magic

    obj = getattr(pnex_magic, name)
    tests = doctest.DocTestFinder().find(obj, f"pnex_magic.{name}", globs={"pnex": pnex_magic})
    examples = [t for t in tests if t.examples]
    assert examples, f"{name}: no docstring examples"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for t in examples:
        runner.run(t)
    assert runner.failures == 0, f"{name}: {runner.failures} docstring example(s) failed (see output)"


def test_every_public_docstring_example_is_run_here():
    import pnex_magic

    with_examples = {n for n in pnex_magic.__all__ if ">>>" in (getattr(pnex_magic, n).__doc__ or "")}
    assert with_examples <= set(PUBLIC_DOCTESTS), with_examples - set(PUBLIC_DOCTESTS)


def test_a_ratio_near_one_shows_which_side_it_falls_on():
    """0.9978 must not print as "1.00×" beside a goal of "faster" (the 8192×4096×4096
    epilogue row of tensor-cores-2026-11-28-1957.json); 1.0 and others keep two decimals."""
    import pnex_results

    assert [pnex_results.ratio(x) for x in (0.9978, 1.004, 1.0, 1.0195, 0.91, None)] == [
        "0.998×", "1.004×", "1.00×", "1.02×", "0.91×", "–"]
