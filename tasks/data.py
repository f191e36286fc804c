"""Prefect tasks of the data stage: each calls one step of `gpt2.data`.

Each is cached on its own step's identity (gpt2.config.identity.data_step_fingerprint)
+ code version, so a new shard size re-shards without re-tokenizing;
runtime settings such as `runtime.num_workers` do not enter the key.
"""

from __future__ import annotations

from prefect import task

from gpt2.config.identity import data_step_fingerprint
from gpt2.config.tree import Config
from gpt2.data.download import download_source
from gpt2.data.shard import LocalShards, shard_tokens
from gpt2.data.sources import SourceFiles
from gpt2.data.tokenize import tokenize_source
from gpt2.data.tokenized import Tokenized
from gpt2.data.upload import upload_shards
from tasks.common import ProgressArtifact, identity_cache_key, not_user_error
from tasks.data_cluster import unit_executor


def step_key(step: str):
    return identity_cache_key(step, lambda config: data_step_fingerprint(config, step))


_CACHED = dict(persist_result=True, retries=2, retry_delay_seconds=10, retry_condition_fn=not_user_error)


@task(name="download", cache_key_fn=step_key("download"), **_CACHED)
def download(config: Config) -> SourceFiles:
    return download_source(config)


@task(name="tokenize", cache_key_fn=step_key("tokenize"), **_CACHED)
def tokenize(config: Config, source: SourceFiles) -> Tokenized:
    artifact = ProgressArtifact(f"Tokenizing {config.data.source}")

    def progress(docs: int, tokens: int, total: int | None) -> None:
        limit = config.data.max_tokens
        fraction = tokens / limit if limit else docs / total if total else 0.0
        artifact.update(fraction)

    result = tokenize_source(config, source, progress, executor=unit_executor(config))
    artifact.update(1.0, force=True)
    return result


@task(name="shard", cache_key_fn=step_key("shard"), **_CACHED)
def shard(config: Config, tokenized: Tokenized) -> LocalShards:
    return shard_tokens(config, tokenized)


@task(name="upload", cache_key_fn=step_key("upload"), **_CACHED)
def upload(config: Config, shards: LocalShards, source: SourceFiles) -> str:
    return upload_shards(config, shards, source)
