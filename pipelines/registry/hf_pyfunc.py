"""The MLflow Model a Llama version is served as (``mlflow models serve``, ``mlflow.pyfunc.load_model``):
a pyfunc over its Hugging Face folder (the ``model`` artifact), loaded with ``AutoModelForCausalLM`` and
``AutoTokenizer``. MLflow copies this file into the model ("models from code"), so serving needs only
mlflow, transformers and torch: nothing of Taxiway. Never imported by Taxiway itself."""

from __future__ import annotations

from typing import Any

import mlflow
import pandas as pd
from mlflow.pyfunc import PythonModel

DEFAULT_NEW_TOKENS = 64


class TextGeneration(PythonModel):
    """Each prompt continued greedily (``max_new_tokens``; ``temperature`` > 0 samples), prompt included."""

    def load_context(self, context: Any) -> None:
        import transformers  # at load, not when MLflow reads this file to save the model

        folder = context.artifacts["model"]
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> list[str]:
        """``model_input``: the prompts, as MLflow hands over the input of the model's signature (one string
        column). A DataFrame hint, not ``list[str]``: MLflow infers no signature from it, so saving the model
        never loads it to predict an example, and the logged signature keeps its ``params``."""
        import torch  # as above

        params = params or {}
        prompts = model_input.iloc[:, 0].astype(str).tolist()
        temperature = float(params.get("temperature", 0.0))
        sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
        out = []
        for prompt in prompts:
            ids = self.tokenizer(str(prompt), return_tensors="pt").input_ids
            with torch.no_grad():
                new = self.model.generate(ids, max_new_tokens=int(params.get("max_new_tokens", DEFAULT_NEW_TOKENS)),
                                          **sampling)
            out.append(self.tokenizer.decode(new[0], skip_special_tokens=True))
        return out


mlflow.models.set_model(TextGeneration())
