"""``runner.attach`` inside training frameworks: a Lightning ``Callback`` (``runner.integrations.lightning``)
and a Hugging Face ``TrainerCallback`` (``runner.integrations.huggingface``). Each is imported on its
own, so that neither framework is needed for the other."""
