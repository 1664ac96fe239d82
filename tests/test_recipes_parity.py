"""hsd's recipes against the makers' own functions, on inputs built here. Each test skips where
the maker's package is not installed; they are installed without their heavy dependencies
(pip install --no-deps olmocr==0.4.27 chandra-ocr==0.2.0, and the `parity` extra), so only
their light modules are imported, and constants of modules that need more (olmocr.pipeline) are
read from their source without running it."""

import ast
import base64
import importlib.util
import io
import shutil
from importlib.metadata import version
from pathlib import Path

import pymupdf
import pytest
from PIL import Image

from hsd_cli.recipes.known import QWEN2_VL_PROCESSOR
from hsd_cli.recipes.messages import build_messages, prompt_text
from hsd_cli.recipes.postprocess import POSTPROCESSORS, olmocr_yaml_page
from hsd_cli.recipes.registry import recipe_for
from hsd_cli.recipes.retry import chandra_repeats_at_end
from hsd_cli.recipes.sizes import chandra_scale_to_fit, pdf_box_size, render_size, smart_resize

OLMOCR_ANSWERS = [
    "---\nprimary_language: en\nis_rotation_valid: True\nrotation_correction: 0\nis_table: False\nis_diagram: False\n---\n# A\n\nText $x$.\n",
    "---\nprimary_language: null\nis_rotation_valid: true\nrotation_correction: 90\nis_table: true\nis_diagram: false\n---\n",
    "---\nprimary_language: no\nis_rotation_valid: 'False'\nrotation_correction: '180'\nis_table: False\nis_diagram: False\n---\nBody",
    "---\nprimary_language: en\nis_rotation_valid: True\nrotation_correction: 45\nis_table: False\nis_diagram: False\n---\nBody",
    "---\nprimary_language: en\nis_rotation_valid: True\nrotation_correction: 0\nis_table: False\n---\nBody",
    "---\nprimary_language: en\nis_rotation_valid: True\nrotation_correction: 0\nis_table: False\nis_diagram: False\nextra: 1\n---\nBody",
    "---\nprimary_language: [en\n---\nBody",
    "No front matter at all",
    "---\nprimary_language: en\nis_rotation_valid: True\nrotation_correction: 0\nis_table: False\nis_diagram: False\nunfinished",
]


def _module_source(module: str) -> str:
    """A maker's module's source, found without importing it (its imports need more than is installed)."""
    spec = importlib.util.find_spec(module)
    return Path(spec.origin).read_text(encoding="utf-8")


def _function(tree: ast.Module, name: str) -> ast.AST:
    return next(node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name)


def _assigned(node: ast.AST, name: str):
    """The literal value assigned to `name` inside `node`."""
    for child in ast.walk(node):
        if isinstance(child, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in child.targets):
            return ast.literal_eval(child.value)
    raise LookupError(name)


def _argument_default(tree: ast.Module, flag: str):
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "add_argument" and call.args:
            if isinstance(call.args[0], ast.Constant) and call.args[0].value == flag:
                return next(ast.literal_eval(k.value) for k in call.keywords if k.arg == "default")
    raise LookupError(flag)


def test_olmocr_prompt_is_olmocrs():
    prompts = pytest.importorskip("olmocr.prompts")
    assert recipe_for("olmocr-2").prompt.text == prompts.build_no_anchoring_v4_yaml_prompt()
    anchor = "Page 1 {x} [y]\nline two"
    assert prompt_text(recipe_for("olmocr-0225").prompt, anchor) == prompts.build_finetuning_prompt(anchor)


def test_olmocr_pipeline_settings_are_olmocrs():
    pytest.importorskip("olmocr")
    tree = ast.parse(_module_source("olmocr.pipeline"))
    recipe = recipe_for("olmocr-2")
    assert recipe.retry.temperatures == tuple(_assigned(tree, "TEMPERATURE_BY_ATTEMPT"))
    assert recipe.decoding.max_new_tokens == _assigned(_function(tree, "build_page_query"), "MAX_TOKENS")
    assert recipe.retry.context_limit == _assigned(_function(tree, "try_single_page"), "MODEL_MAX_CONTEXT")
    assert recipe.render.longest_side_px == _argument_default(tree, "--target_longest_image_dim")
    assert recipe.retry.max_attempts == _argument_default(tree, "--max_page_retries")


def test_olmocr_message_order_is_olmocrs():
    pytest.importorskip("olmocr")
    query = _function(ast.parse(_module_source("olmocr.pipeline")), "build_page_query")
    content = next(node for node in ast.walk(query) if isinstance(node, ast.Dict)
                   and any(isinstance(k, ast.Constant) and k.value == "content" for k in node.keys))
    parts = content.values[[k.value for k in content.keys].index("content")]
    kinds = [ast.literal_eval(part.values[0]) for part in parts.elts]
    ours = [part["type"] for part in build_messages(recipe_for("olmocr-2").prompt)[0]["content"]]
    assert [kind.replace("image_url", "image") for kind in kinds] == ours == ["text", "image"]


@pytest.mark.parametrize("answer", OLMOCR_ANSWERS)
def test_olmocr_front_matter_is_olmocrs(answer):
    front_matter = pytest.importorskip("olmocr.train.front_matter")
    from olmocr.prompts import PageResponse

    parser = front_matter.FrontMatterParser(front_matter_class=PageResponse)
    fields, text = parser._extract_front_matter_and_text(answer)
    try:
        theirs = parser._parse_front_matter(fields, text)
    except (TypeError, ValueError):
        theirs = None
    ours = olmocr_yaml_page(answer)
    assert ours.valid == (theirs is not None)
    if theirs is not None:
        assert ours.text == theirs.natural_text
        assert ours.fields == {name: getattr(theirs, name) for name in ours.fields}


@pytest.mark.parametrize("size_pt", [(612.0, 792.0), (720.0, 540.0), (595.276, 841.89001), (180.0, 300.0), (2267.25, 1836.75)])
def test_olmocr_render_size_is_pdftoppms(tmp_path, size_pt):
    renderpdf = pytest.importorskip("olmocr.data.renderpdf")
    if not (shutil.which("pdftoppm") and shutil.which("pdfinfo")):
        pytest.skip("poppler's pdftoppm and pdfinfo are not installed")
    doc = pymupdf.open()
    doc.new_page(width=size_pt[0], height=size_pt[1]).insert_text((20, 40), "parity")
    path = tmp_path / "page.pdf"
    doc.save(path)
    written = pymupdf.open(path)
    box = pdf_box_size(written.xref_get_key(written[0].xref, "MediaBox")[1])  # as written, in doubles
    png = base64.b64decode(renderpdf.render_pdf_to_base64png(str(path), 1, target_longest_image_dim=1288))
    assert render_size(recipe_for("olmocr-2").render, box) == Image.open(io.BytesIO(png)).size


def test_smart_resize_is_transformers():
    # The PIL processor's module: the default one needs torchvision.
    qwen2_vl = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    for height, width in [(1288, 996), (1650, 1275), (28, 28), (10, 1500), (9000, 7000), (1289, 911), (3500, 2700)]:
        theirs = qwen2_vl.smart_resize(height, width, factor=28, min_pixels=QWEN2_VL_PROCESSOR.min_pixels,
                                       max_pixels=QWEN2_VL_PROCESSOR.max_pixels)
        assert smart_resize(height, width, QWEN2_VL_PROCESSOR) == tuple(theirs)


def _chandra_util():
    """chandra/model/util.py loaded alone: chandra.model's package imports its vLLM client (openai)."""
    pytest.importorskip("chandra")
    spec = importlib.util.find_spec("chandra")
    path = Path(spec.submodule_search_locations[0]) / "model" / "util.py"
    util_spec = importlib.util.spec_from_file_location("chandra_model_util", path)
    util = importlib.util.module_from_spec(util_spec)
    util_spec.loader.exec_module(util)
    return util


def _installed_chandra_recipe():
    return recipe_for("chandra-2" if version("chandra-ocr").startswith("0.2") else "chandra-1")


def test_chandra_scale_to_fit_is_chandras():
    util = _chandra_util()
    recipe = _installed_chandra_recipe()
    for size in [(1632, 2112), (3000, 4000), (1024, 1707), (500, 300), (2112, 1632), (4000, 400)]:
        theirs = util.scale_to_fit(Image.new("RGB", size, "white")).size
        assert chandra_scale_to_fit(size, recipe.client_resize) == theirs


def test_chandra_repeat_detector_is_chandras():
    util = _chandra_util()
    if not version("chandra-ocr").startswith("0.2"):
        pytest.skip("chandra-ocr 0.1's detector runs on the Markdown")
    for text in ["<p>intro</p>" + "ha" * 40, "<p>a plain page.</p>", "x" * 13, "x" * 14, "<td>1</td>" * 30, ""]:
        assert chandra_repeats_at_end(text) == util.detect_repeat_token(text)


def test_chandra_prompt_is_chandras():
    prompts = pytest.importorskip("chandra.prompts")
    assert _installed_chandra_recipe().prompt.text == prompts.PROMPT_MAPPING["ocr_layout"]


CHANDRA_ANSWERS = [
    '<div data-bbox="0 0 1000 40" data-label="Page-Header"><p>Journal of Things</p></div>'
    '<div data-bbox="0 50 1000 90" data-label="Section-Header"><h2>1. Intro_duction</h2></div>'
    '<div data-bbox="0 100 1000 200" data-label="Text">Cost $5 with <math>x^2 + y</math> and <b>bold</b>*</div>'
    '<div data-bbox="0 210 1000 260" data-label="Equation-Block"><math display="block">\\int_0^1 f</math></div>'
    '<div data-bbox="0 300 1000 500" data-label="Table"><table><tr><td>a</td><td>$1</td></tr></table></div>'
    '<div data-bbox="0 600 500 900" data-label="Image"><img alt="A chart of sales"/>Chart</div>'
    '<div data-bbox="0 950 1000 990" data-label="Page-Footer">Page 3</div>',
    '<div data-label="List-Group"><ul><li>one [a](b)</li><li>two<ul><li>nested</li></ul></li></ul></div>'
    '<div data-label="Text"><p>Para with <a href="http://x.org">link (x)</a> and <img/> stray</p></div>'
    '<div data-label="Blank-Page"></div><div data-label="Figure"></div>',
    "<div data-label=\"Code-Block\"><pre>def f(x):\n    return x_1 * 2</pre></div><div>unlabelled $</div>",
]


@pytest.mark.parametrize("answer", CHANDRA_ANSWERS)
def test_chandra_markdown_is_chandras(answer):
    output = pytest.importorskip("chandra.output")
    ours = POSTPROCESSORS[_installed_chandra_recipe().output.postprocess](answer, 0)
    assert ours.text == output.parse_markdown(answer)


@pytest.fixture(scope="module")
def qwen2_tokenizer(tmp_path_factory):
    """The real Qwen2 tokenizer (tests/data/qwen2_tokenizer), with Qwen2-VL's chat template as
    olmOCR's checkpoints carry it."""
    import lzma

    from transformers import AutoTokenizer

    from hsd_cli.bench.prompt_tokens import QWEN2_VL_CHAT_TEMPLATE

    packed = Path(__file__).parent / "data" / "qwen2_tokenizer"
    directory = tmp_path_factory.mktemp("qwen2_tokenizer")
    (directory / "tokenizer.json").write_bytes(lzma.decompress((packed / "tokenizer.json.xz").read_bytes()))
    shutil.copy(packed / "tokenizer_config.json", directory)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    tokenizer.chat_template = QWEN2_VL_CHAT_TEMPLATE
    return tokenizer


def test_olmocr_prompt_token_ids_are_olmocrs(docs_dir, tmp_path, qwen2_tokenizer):
    """Per page, the token ids hsd's processor path gives for olmOCR-2 (its render of the page, its
    chat layout, the Qwen2-VL processor at the checkpoint's limits) equal those of olmOCR's own
    request (its messages through the checkpoint's chat template, its pdftoppm rendering's
    image tokens by transformers' smart_resize), in the real Qwen2 tokenizer."""
    renderpdf = pytest.importorskip("olmocr.data.renderpdf")
    if not (shutil.which("pdftoppm") and shutil.which("pdfinfo")):
        pytest.skip("olmOCR renders with poppler's pdftoppm (poppler-utils)")
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as transformers_smart_resize

    from hsd_cli.bench.prompt_tokens import makers_olmocr_messages, prompt_ids
    from hsd_cli.decoding.hf_target.families import ChatLayout, adapter_for
    from hsd_cli.recipes.messages import image_first
    from hsd_cli.stages.rasterize import render_for_model

    recipe, limits = recipe_for("olmocr-2"), QWEN2_VL_PROCESSOR
    adapter = adapter_for("qwen2_5_vl")
    processor = adapter.new_processor(
        qwen2_tokenizer, patch_size=limits.patch_px, merge_size=limits.merge, min_pixels=limits.min_pixels, max_pixels=limits.max_pixels,
    )
    layout = ChatLayout(image_first=image_first(recipe.prompt), system=recipe.prompt.system)
    landscape = tmp_path / "landscape.pdf"
    with pymupdf.open() as doc:
        doc.new_page(width=842, height=595).insert_text((72, 72), "A landscape A4 page.")
        doc.save(landscape)
    checked = 0
    for pdf in (docs_dir / "report.pdf", docs_dir / "scan.pdf", landscape):
        with pymupdf.open(pdf) as doc:
            for page in doc:
                picture = render_for_model(page, recipe.render)
                ours = adapter.processor_inputs(processor, [picture], [recipe.prompt.text], layout)["input_ids"][0].tolist()
                png = base64.b64decode(renderpdf.render_pdf_to_base64png(str(pdf), page.number + 1, target_longest_image_dim=1288))
                with Image.open(io.BytesIO(png)) as theirs_picture:
                    assert picture.size == theirs_picture.size, pdf.name
                    height, width = transformers_smart_resize(
                        theirs_picture.height, theirs_picture.width, factor=limits.grid_px,
                        min_pixels=limits.min_pixels, max_pixels=limits.max_pixels,
                    )
                image_tokens = (height // limits.grid_px) * (width // limits.grid_px)
                assert ours == prompt_ids(qwen2_tokenizer, makers_olmocr_messages(recipe.prompt.text), image_tokens), pdf.name
                checked += 1
    assert checked >= 3


def test_render_diff_measures_pdftoppm_against_pymupdf_at_the_same_size(docs_dir):
    if shutil.which("pdftoppm") is None:
        pytest.skip("needs poppler's pdftoppm")
    from hsd_cli.bench.render_diff import pdftoppm_render, pixel_difference
    from hsd_cli.stages.rasterize import render_for_model

    with pymupdf.open(docs_dir / "report.pdf") as doc:
        ours = render_for_model(doc[0], recipe_for("olmocr-2").render)
    theirs = pdftoppm_render(docs_dir / "report.pdf", 1, ours.size)
    assert theirs.size == ours.size
    same = pixel_difference(ours, ours)
    assert same["mean_abs"] == same["over_32"] == same["ink_only_hsd"] == 0.0
    measured = pixel_difference(ours, theirs)
    assert 0 < measured["mean_abs"] < 20 and measured["ink"] > 0.005, "the same page, drawn by two renderers"
    shifted = pixel_difference(ours.transpose(Image.Transpose.FLIP_TOP_BOTTOM), theirs)
    assert shifted["ink_only_hsd"] > measured["ink_only_hsd"], "another page is far"
