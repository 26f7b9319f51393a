"""A registered version as something anyone can load and serve: a Llama is logged as an MLflow Model
(``mlflow models serve -m models:/NAME@champion``, ``mlflow.pyfunc.load_model``): a pyfunc over its
Hugging Face folder (``hf_pyfunc.py``, which needs only transformers to serve), the folder kept as
Taxiway exported it (weights, ``config.json``, tokenizer files, and Taxiway's ``model.json``) so
``AutoModelForCausalLM`` loads it as it is; a GPT, which ``transformers`` cannot build, as its folder.
``model_folder`` finds the folder in either layout, so versions logged before this keep loading.

(Not the ``transformers`` flavor: saving a local checkpoint with it fails on transformers 5's lazy
pipeline classes in MLflow 3.17, and saving a loaded pipeline holds the whole model in memory.)"""

from __future__ import annotations

import tempfile
from importlib.metadata import version
from pathlib import Path
from typing import Any

import yaml

from pipelines import hf_folder

ARTIFACT = "model"
EXAMPLE_PROMPT = "Once upon a time"
_CODE = Path(__file__).with_name("hf_pyfunc.py")
# what serving imports; pinned here so MLflow never loads the model to infer them
_SERVING_PACKAGES = ("mlflow", "transformers", "torch", "tokenizers", "safetensors")


def log_model(c: Any, run_id: str, model_dir: Path) -> None:
    """Log ``model_dir`` as the run's ``model`` artifact: an MLflow Model where it is a Hugging Face folder."""
    if not hf_folder.is_hf(model_dir):
        c.log_artifacts(run_id, str(model_dir), artifact_path=ARTIFACT)
        return
    import mlflow.pyfunc  # mlflow (~1 s): DAG parse must not pay for it
    from mlflow.models import infer_signature  # as above

    signature = infer_signature([EXAMPLE_PROMPT], [EXAMPLE_PROMPT + " ..."],
                                params={"max_new_tokens": 64, "temperature": 0.0})
    with tempfile.TemporaryDirectory(prefix="taxiway-mlflow-model-") as tmp:
        path = Path(tmp) / ARTIFACT
        mlflow.pyfunc.save_model(str(path), python_model=str(_CODE), artifacts={ARTIFACT: str(model_dir)},
                                 signature=signature, input_example=([EXAMPLE_PROMPT], {"max_new_tokens": 16}),
                                 pip_requirements=[f"{name}=={version(name)}" for name in _SERVING_PACKAGES])
        c.log_artifacts(run_id, str(path), artifact_path=ARTIFACT)


def model_folder(downloaded: Path) -> Path:
    """The model folder inside a downloaded version: the ``model`` artifact of an MLflow Model, or the
    download itself (a GPT, or a version logged before versions were MLflow Models)."""
    mlmodel = downloaded / "MLmodel"
    if not mlmodel.is_file():
        return downloaded
    pyfunc = (yaml.safe_load(mlmodel.read_text()).get("flavors") or {}).get("python_function") or {}
    return downloaded / ((pyfunc.get("artifacts") or {}).get(ARTIFACT, {}).get("path") or f"artifacts/{ARTIFACT}")
