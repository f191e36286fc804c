"""Config tree: presets, dotted overrides, all-at-once validation, identity."""

from __future__ import annotations

import pytest

from gpt2.config.identity import data_fingerprint, data_step_fingerprint, train_fingerprint
from gpt2.config.overrides import ConfigError, parse_assignments, resolve_config
from gpt2.config.presets import PRESETS
from gpt2.config.tree import Config
from gpt2.data.epoch import planned_steps


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_valid_configs(name):
    config = resolve_config(name)
    assert isinstance(config, Config)
    assert config.preset == name


def test_gpt2_124m_finetune_is_nanogpts_shakespeare_recipe_from_openais_weights():
    c, base = resolve_config("gpt2-124m-finetune"), resolve_config("gpt2-124m")
    assert c.train.init_from == "hf://openai-community/gpt2" and c.model == base.model
    assert c.train.lr == 3e-5 and c.train.min_lr_ratio == 1.0 and c.train.warmup_steps <= 10  # constant after warmup
    assert c.train.total_batch_tokens == 32 * 1024 and c.train.max_steps == 20 and c.train.eval_every == 5
    assert c.data.source.endswith("tinyshakespeare/input.txt") and c.data.max_document_chars > 1_115_394


def test_gpt2_124m_is_the_llmc_recipe():
    c = resolve_config("gpt2-124m")
    assert (c.model.n_layer, c.model.n_head, c.model.n_embd, c.model.block_size) == (12, 12, 768, 1024)
    assert c.model.vocab_size == 50304
    assert c.train.total_batch_tokens == 524_288
    assert c.train.betas == (0.9, 0.95) and c.train.lr == 6e-4 and c.train.weight_decay == 0.1
    assert c.train.grad_clip == 1.0 and 600 <= c.train.warmup_steps <= 800
    # One epoch of the prepared split: ~10B tokens of decay (19,073 steps) before the data stage has run
    assert c.train.max_steps == "epoch"
    assert 9.5e9 < planned_steps(c)[0] * c.train.total_batch_tokens < 10.5e9
    assert "fineweb-edu" in c.data.source and "10BT" in c.data.source


def test_overrides_are_typed_from_strings():
    c = resolve_config("smoke", ["train.max_steps=7", "data.source=gs://bucket/x/*.jsonl", "train.betas=[0.8,0.9]"])
    assert c.train.max_steps == 7
    assert c.data.source == "gs://bucket/x/*.jsonl"
    assert c.train.betas == (0.8, 0.9)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        resolve_config(
            "smoke",
            ["train.max_steps=-1", "nope.key=1", "model.n_head=3", "data.shard_size=abc", "missing-equals"],
        )
    problems = info.value.problems
    text = "\n".join(problems)
    assert len(problems) == 5, text
    for needle in ("train.max_steps", "nope.key", "n_head", "data.shard_size", "missing-equals"):
        assert needle in text


@pytest.mark.parametrize("value", ["-3", "0"])
def test_a_micro_batch_below_one_is_refused_where_it_enters(value):
    # It used to pass `gpt2 config show` and fail only inside the trainer,
    # after a server start, with a message about divisors.
    with pytest.raises(ConfigError) as info:
        resolve_config("smoke", [f"train.micro_batch_size={value}", "train.lr=-1"])
    text = "\n".join(info.value.problems)
    assert len(info.value.problems) == 2 and "train.micro_batch_size" in text and "auto" in text and "train.lr" in text
    assert resolve_config("smoke", ["train.micro_batch_size=1"]).train.micro_batch_size == 1


def test_a_step_of_partial_sequences_is_refused_naming_valid_sizes():
    with pytest.raises(ConfigError) as info:
        resolve_config("smoke", ["train.total_batch_tokens=1000"])  # block_size 64
    [problem] = info.value.problems
    assert "train.total_batch_tokens" in problem and "model.block_size (64)" in problem
    assert "960 or 1024" in problem


def test_a_bad_value_exits_2_before_any_server_or_write(tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "cli.main", "train", "--preset", "smoke", "--root", str(tmp_path),
                          "--set", "train.micro_batch_size=-3"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "train.micro_batch_size" in out.stderr, out.stderr
    assert not list(tmp_path.iterdir())  # nothing written: no lease, no attempt record


@pytest.mark.parametrize(("root", "says"), [
    ("s3://", "names no bucket after 's3://'"), ("gs://", "e.g. gs://BUCKET/PREFIX"), ("s3:///prefix", "s3://"),
    ("gcs://  ", "gcs://BUCKET/PREFIX"), ("file://", "names no path after 'file://'")])
def test_a_root_that_names_no_bucket_or_path_is_refused_where_it_enters(root, says):
    # `--root s3://` used to train into a local folder named `s3:` with MLflow in the default store.
    with pytest.raises(ConfigError) as info:
        resolve_config("smoke", root=root)
    [problem] = info.value.problems
    assert "runtime.root" in problem and says in problem


@pytest.mark.parametrize("root", ["s3://bucket", "gs://b/prefix", "file:///", "file:///tmp/x", "memory://", "memory://r"])
def test_a_root_with_its_bucket_or_path_is_accepted(root):
    assert resolve_config("smoke", root=root).runtime.root == root


@pytest.mark.parametrize("root", ["ftp://x/y", "http://example.com/root", "hf://datasets/me/x"])
def test_a_root_whose_scheme_is_not_supported_is_refused_naming_it(root):
    # ftp:// used to be accepted and fail 14 s later in a DNS lookup of host x.
    with pytest.raises(ConfigError) as info:
        resolve_config("smoke", root=root)
    [problem] = info.value.problems
    assert "runtime.root" in problem and root in problem and "gs://" in problem and "s3://" in problem


def test_a_refused_root_is_shown_redacted():
    with pytest.raises(ConfigError) as info:
        resolve_config("smoke", root="ftp://alice:SEKRET@x/y")
    assert "the scheme 'ftp' is not supported" in str(info.value) and "SEKRET" not in str(info.value)


@pytest.mark.parametrize("root", ["./relative", "/abs/path", "file:///abs", "gs://b/p", "s3://b/p", "memory://r"])
def test_supported_roots_pass(root):
    assert resolve_config("smoke", root=root).runtime.root == root


def test_unknown_preset_names_the_choices():
    with pytest.raises(ConfigError, match="smoke"):
        resolve_config("gpt5")


def test_config_is_frozen():
    c = resolve_config("smoke")
    with pytest.raises(Exception):
        c.train.max_steps = 3


def test_runtime_never_enters_identity():
    a = resolve_config("smoke")
    b = resolve_config(
        "smoke",
        {"runtime.num_workers": 7, "runtime.device": "cuda", "runtime.work_dir": "/elsewhere",
         "runtime.price_per_hour": 2.5, "runtime.cpu_price_per_hour": 0.1, "runtime.heartbeat_s": 5,
         "eval.limit": 5, "export.alias": "x"},
        root="gs://other/bucket",
    )
    assert data_fingerprint(a) == data_fingerprint(b)
    assert train_fingerprint(a) == train_fingerprint(b)


def test_identity_fields_change_fingerprints_per_step():
    base = resolve_config("smoke")
    sharded = resolve_config("smoke", {"data.shard_size": 4096})
    limited = resolve_config("smoke", {"data.max_documents": 10})
    # A new shard size re-shards but does not re-tokenize or re-download.
    assert data_step_fingerprint(base, "tokenize") == data_step_fingerprint(sharded, "tokenize")
    assert data_step_fingerprint(base, "shard") != data_step_fingerprint(sharded, "shard")
    # A document limit re-tokenizes but does not re-download.
    assert data_step_fingerprint(base, "download") == data_step_fingerprint(limited, "download")
    assert data_step_fingerprint(base, "tokenize") != data_step_fingerprint(limited, "tokenize")
    assert data_fingerprint(base) != data_fingerprint(sharded)
    # Training identity covers the data it trains on.
    assert train_fingerprint(base) != train_fingerprint(sharded)
    assert train_fingerprint(base) != train_fingerprint(resolve_config("smoke", {"train.lr": 1e-4}))


def test_parse_assignments_json_and_strings():
    values, problems = parse_assignments(["a.b=1", "c.d=true", "e.f=null", "g.h=text", "bad"])
    assert values == {"a.b": 1, "c.d": True, "e.f": None, "g.h": "text"}
    assert len(problems) == 1 and "bad" in problems[0]


def test_credentials_in_urls_are_refused():
    with pytest.raises(ConfigError) as info:
        resolve_config("smoke", {"tracking.uri": "https://alice:s3cr3t@mlflow.example.com",
                                 "data.source": "https://h/x.jsonl?token=abc"})
    text = str(info.value)
    assert "tracking.uri" in text and "data.source" in text
    assert "s3cr3t" not in text and "abc" not in text
    # A user name alone, or a plain bucket URL, is fine.
    resolve_config("smoke", {"tracking.uri": "https://mlflow.example.com"}, root="gs://bucket/p")


def test_redact_masks_passwords_and_tokens():
    from gpt2.secrets import redact

    text = "postgresql://u:pw123@db/x and hf_abcdefghijklmnopqrstuvwxyz0123 and AKIAABCDEFGHIJKLMNOP"
    out = redact(text)
    assert "pw123" not in out and "hf_abcdef" not in out and "AKIAABCD" not in out
    assert "postgresql://u:***@db/x" in out


# Each URL carries one credential form; SEKRET marks every secret part.
CREDENTIAL_URLS = [
    "https://h/x.jsonl?access_token=SEKRET",
    "https://h/x.jsonl?a=1&Access_Token=SEKRET",
    ("https://storage.googleapis.com/b/x.jsonl?X-Goog-Algorithm=GOOG4-RSA-SHA256"
     "&X-Goog-Credential=SEKRET%2F20240101%2Fauto&X-Goog-Signature=SEKRET"),
    ("https://b.s3.amazonaws.com/x.jsonl?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=SEKRET%2F20240101"
     "&X-Amz-Security-Token=SEKRET&X-Amz-Signature=SEKRET"),
    "https://a.blob.core.windows.net/c/x.jsonl?sv=2022-11-02&se=2030-01-01&sig=SEKRET%3D",
    "https://www.googleapis.com/x.jsonl?KEY=SEKRET",
    "https://login.example.com/x?client_id=app&client_secret=SEKRET",
    "https://SEKRET@github.com/org/data.git",
    "https://alice:SEKRET@mlflow.example.com",
    "https://alice:SEK@RET@mlflow.example.com",  # an unencoded `@` in the password
    "abfs://container:SEKRET@account.dfs.core.windows.net/x.jsonl",
]
HARMLESS_URLS = [
    "hf://datasets/HuggingFaceFW/fineweb-edu/sample/10BT/*.parquet",
    "gs://bucket/path/x.jsonl",
    "s3://bucket/key=2024/part-0.parquet",
    "/data/corpus.jsonl",
    "file:///data/corpus.jsonl",
    "https://huggingface.co/datasets/org/x/resolve/main/a.jsonl?download=true",
    "https://h/x.jsonl?key_field=text&token_count=3",
    "sqlite:////srv/mlflow/mlflow.db",
    "abfs://container@account.dfs.core.windows.net/data/x.jsonl",  # the container, not a user
]


@pytest.mark.parametrize("url", CREDENTIAL_URLS)
def test_every_credential_form_is_refused_without_being_shown(url):
    with pytest.raises(ConfigError) as info:
        resolve_config("smoke", {"data.source": url})
    assert "data.source" in str(info.value) and "SEK" not in str(info.value)
    # Validated directly, pydantic's own text would print the input: it shows the value redacted.
    tree = PRESETS["smoke"]().model_dump()
    tree["tracking"]["uri"] = url
    with pytest.raises(ValueError) as raw:
        Config.model_validate(tree)
    assert "tracking.uri" in str(raw.value)
    for text in (str(raw.value), repr(raw.value), raw.value.json()):
        assert "SEK" not in text and "***" in text


def test_every_bad_field_is_named():
    url = "https://h/x?sig=SEKRET"
    with pytest.raises(ConfigError) as info:
        resolve_config("smoke", {"data.source": url, "eval.hellaswag_source": url, "tracking.uri": url}, root=url)
    assert all(field in str(info.value) for field in ("data.source", "eval.hellaswag_source", "tracking.uri",
                                                       "runtime.root"))
    assert "SEKRET" not in str(info.value) and "sig=***" in str(info.value)


@pytest.mark.parametrize("url", HARMLESS_URLS)
def test_urls_without_credentials_are_accepted_and_left_alone(url):
    from gpt2.secrets import redact

    assert resolve_config("smoke", {"data.source": url}).data.source == url
    assert redact(url) == url


@pytest.mark.parametrize("url", CREDENTIAL_URLS)
def test_redact_masks_each_credential_form_in_text(url):
    from gpt2.secrets import redact

    out = redact(f"download of {url} failed: 403")
    assert "SEK" not in out and out.startswith(f"download of {url.split(':')[0]}://") and out.endswith(" failed: 403")


def test_redact_keeps_what_names_the_secret():
    from gpt2.secrets import redact

    assert redact("https://h/x?sv=1&sig=abc%2F&se=2") == "https://h/x?sv=1&sig=***&se=2"
    assert redact("https://h/x?X-Amz-Signature=abc&x=1") == "https://h/x?X-Amz-Signature=***&x=1"
    assert redact("https://ghp_tok@github.com/o/r.git") == "https://***@github.com/o/r.git"
    assert redact("Authorization: Bearer eyJhbGciOi.e30.c2ln") == "Authorization: Bearer ***"
    assert redact("headers={'Authorization': 'Basic dTpw'}") == "headers={'Authorization': 'Basic ***'}"
    assert redact("client_secret=abc and password=hunter2") == "client_secret=*** and password=***"
    # No scheme, no credential: scp-style git remotes and e-mail addresses stay.
    assert redact("git@github.com:org/repo.git, mail alice@example.com") == (
        "git@github.com:org/repo.git, mail alice@example.com")


@pytest.mark.parametrize(("name", "params_m", "tokens_b"), [
    ("gpt2-124m", 124, 10.0), ("gpt2-350m", 355, 31.5), ("gpt2-774m", 774, 150.0), ("gpt2-1558m", 1558, 33.6)])
def test_gpt2_presets_have_the_sizes_of_their_names(name, params_m, tokens_b):
    """Parameter counts of OpenAI's GPT-2 sizes (the tied embedding counted
    once, at GPT-2's 50257 rows), and llm.c's token budgets (steps × batch)."""
    import torch

    from gpt2.model import GPT

    config = resolve_config(name)
    with torch.device("meta"):  # no memory: 1.5B parameters would take 6 GB
        model = GPT(config.model)
    padding = (config.model.vocab_size - 50257) * config.model.n_embd
    total = model.num_params(non_embedding=False) - padding
    assert total / 1e6 == pytest.approx(params_m, rel=0.01)
    steps = planned_steps(config)[0]  # gpt2-124m: one epoch, ~10B tokens until the data says how many
    assert steps * config.train.total_batch_tokens / 1e9 == pytest.approx(tokens_b, rel=0.02)
    assert config.train.micro_batch_size == "auto" and config.train.warmup_steps == 700


@pytest.mark.parametrize("preset,overrides,says", [
    ("smoke", {"train.max_step": 40}, "unknown key 'train.max_step' (did you mean train.max_steps"),
    ("smoke", {"model.max_steps": 40}, "(did you mean train.max_steps?)"),
    ("small", {}, "unknown preset 'small' (did you mean smoke?)"),
    ("gpt2-124", {}, "(did you mean gpt2-124m"),
    # The names the reference projects taught (#64 item 8), with a section or none.
    ("smoke", {"train.learning_rate": 1e-3}, "unknown key 'train.learning_rate' (did you mean train.lr?)"),
    ("smoke", {"learning_rate": 1e-3}, "(did you mean train.lr?)"),
    ("smoke", {"max_iters": 10}, "(did you mean train.max_steps?)"),
    ("smoke", {"batch_size": 4}, "(did you mean train.micro_batch_size or eval.batch_size?)"),
    ("smoke", {"total_batch_size": 4096}, "(did you mean train.total_batch_tokens?)"),
    ("smoke", {"n_layer": 2}, "(did you mean model.n_layer?)"),
])
def test_a_mistyped_key_or_preset_names_the_closest_valid_one(preset, overrides, says):
    from gpt2.config.overrides import ConfigError, resolve_config

    with pytest.raises(ConfigError) as err:
        resolve_config(preset, overrides)
    assert says in str(err.value)
