"""``@registry.job`` (issue 22, item 2): a job type declared by its handler, the payload class
taken from the first parameter's annotation (this module has ``from __future__ import
annotations``: every annotation here is a string, resolved as typing.get_type_hints does). Payload
classes are attrs classes or dataclasses, structured with the same strictness; anything else is
refused at registration, naming it."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import pytest
import trio
from jobkit import wait_status

import pipeline
from pipeline import Config

if TYPE_CHECKING:  # only for the type checker: the decorator resolves the first annotation alone
    from pipeline import JobContext


@attrs.frozen
class ResizeAvatar:
    user_id: str
    size: int = 128


@dataclasses.dataclass(frozen=True)
class Crop:
    left: int
    top: int


@dataclasses.dataclass
class Thumbnail:
    media_id: str
    sizes: list[int] = dataclasses.field(default_factory=list)
    crop: Crop | None = None
    tags: tuple[str, ...] = ()


@dataclasses.dataclass
class Uploaded:
    media_id: str


class NotAPayload:  # neither attrs nor a dataclass
    def __init__(self, media_id: str) -> None:
        self.media_id = media_id


def test_the_decorator_declares_the_type_and_returns_the_function_unchanged() -> None:
    reg = pipeline.Registry()

    async def resize_avatar(job: ResizeAvatar, ctx: JobContext) -> None:
        pass

    def make_thumbnail(job: Thumbnail, ctx: JobContext) -> None:
        pass

    assert reg.job(resize_avatar) is resize_avatar  # bare: @registry.job
    assert reg.job("thumbs", concurrency=3, timeout=9.5, max_attempts=7, global_limit=2)(make_thumbnail) is make_thumbnail
    assert reg.job_types() == ["resize_avatar", "thumbs"]
    avatar, thumbs = reg.spec("resize_avatar"), reg.spec("thumbs")
    assert (avatar.cls, avatar.handler, avatar.sync) == (ResizeAvatar, resize_avatar, False)
    assert (thumbs.cls, thumbs.handler, thumbs.sync) == (Thumbnail, make_thumbnail, True)
    assert (thumbs.concurrency, thumbs.timeout, thumbs.max_attempts, thumbs.global_limit) == (3, 9.5, 7, 2)
    assert reg.name_of(Thumbnail("m1")) == "thumbs"

    @reg.job()
    async def with_parentheses(job: Crop, ctx: JobContext) -> None:
        pass

    assert reg.spec("with_parentheses").handler is with_parentheses
    # a payload class is one job type's: enqueue(obj) finds the type by the object's class
    with pytest.raises(ValueError, match="ResizeAvatar is already job type 'resize_avatar'"):
        @reg.job
        async def resize_again(job: ResizeAvatar, ctx: JobContext) -> None:
            pass
    # register() keeps working beside it, and a unit test calls the handler as it is
    register_form = pipeline.Registry()
    register_form.register("resize_avatar", ResizeAvatar, resize_avatar)
    assert register_form.spec("resize_avatar").cls is ResizeAvatar
    trio.run(resize_avatar, ResizeAvatar("u1"), None)
    assert make_thumbnail(Thumbnail("m1"), None) is None  # type: ignore[arg-type, func-returns-value]


def test_a_dataclass_payload_is_structured_as_strictly_as_an_attrs_one() -> None:
    reg = pipeline.Registry()
    reg.job(name="thumbs")(_thumbs)
    assert reg.decode("thumbs", '{"media_id": "m1", "sizes": [1, 2], "crop": {"left": 1, "top": 2}, "tags": ["a"]}') == \
        Thumbnail("m1", [1, 2], Crop(1, 2), ("a",))
    assert reg.encode(Thumbnail("m1", [3], Crop(0, 5))) == \
        ("thumbs", '{"media_id":"m1","sizes":[3],"crop":{"left":0,"top":5},"tags":[]}')
    refused = {
        '{"media_id": "m1", "colour": "red"}': "extra fields found (colour)",  # unknown keys
        '{"media_id": "m1", "crop": {"left": 1, "top": 2, "z": 3}}': "extra fields found (z) @ $.crop",
        '{"media_id": 42}': "expected a string, got int @ $.media_id",
        '{"media_id": "m1", "sizes": "12"}': "expected an array, got str @ $.sizes",  # not ["1", "2"]
        '{"media_id": "m1", "tags": {"a": 1}}': "expected an array, got dict @ $.tags",
        '{"media_id": "m1", "crop": {"left": "1", "top": 2}}': "expected an integer, got str @ $.crop.left",
        '{"sizes": []}': "required field missing @ $.media_id",
    }
    for payload, expected in refused.items():
        with pytest.raises(pipeline.InvalidPayload, match="does not fit Thumbnail") as caught:
            reg.validate("thumbs", payload)
        assert expected in str(caught.value), (payload, str(caught.value))


def _thumbs(job: Thumbnail, ctx: JobContext) -> None:
    pass


def test_what_is_neither_attrs_nor_a_dataclass_is_refused_naming_it() -> None:
    reg = pipeline.Registry()

    def takes_a_dict(job: dict[str, str], ctx: JobContext) -> None:
        pass

    def takes_a_class(job: NotAPayload, ctx: JobContext) -> None:
        pass

    with pytest.raises(TypeError, match=r"job type 'takes_a_dict': the payload class dict\[str, str\] is neither"):
        reg.job(takes_a_dict)
    with pytest.raises(TypeError, match="job type 'takes_a_class': the payload class NotAPayload is neither an attrs class nor a dataclass"):
        reg.job(takes_a_class)
    with pytest.raises(TypeError, match="NotAPayload is neither"):
        reg.register("plain", NotAPayload)
    with pytest.raises(TypeError, match="payload class Crop"):  # an instance is not a class
        reg.register("instance", Crop(1, 2))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="event 'uploaded': the payload class NotAPayload"):
        reg.add_event("uploaded", NotAPayload, lambda event, config: [])
    assert reg.job_types() == []


def test_a_missing_or_unresolvable_annotation_says_what_to_write() -> None:
    reg = pipeline.Registry()

    def bare(job, ctx):  # type: ignore[no-untyped-def]
        pass

    def misspelt(job: ResizeAvatr, ctx: JobContext) -> None:  # type: ignore[name-defined]  # noqa: F821
        pass

    def local_class() -> typing.Any:
        @attrs.frozen
        class Local:
            n: int

        def handler(job: Local, ctx: JobContext) -> None:  # a string annotation naming a local class
            pass

        return handler

    def no_parameters() -> None:
        pass

    with pytest.raises(TypeError) as caught:
        reg.job(bare)
    assert "bare" in str(caught.value) and "'job' has no annotation" in str(caught.value)
    assert "`def bare(job: MyPayload, ctx: pipeline.JobContext)`" in str(caught.value)
    with pytest.raises(TypeError) as caught:
        reg.job(misspelt)
    message = str(caught.value)
    assert "misspelt" in message and "'ResizeAvatr' of its first parameter 'job' cannot be resolved" in message
    assert "NameError" in message and "define the payload class at module level" in message
    with pytest.raises(TypeError, match="'Local' of its first parameter 'job' cannot be resolved"):
        reg.job(local_class())
    with pytest.raises(TypeError, match="no_parameters takes no job parameter"):
        reg.job(no_parameters)
    assert reg.job_types() == []


async def test_dataclass_and_attrs_payloads_run_end_to_end(config: Config) -> None:
    """A dataclass job routed from a dataclass event, an attrs job beside it, a sync and an
    async handler: each gets its payload back as the class it was enqueued as."""
    got: list[object] = []
    reg = pipeline.Registry()
    reg.add_event("uploaded", Uploaded, lambda event, config: [pipeline.Routed(Thumbnail(event.media_id, [64]))])

    @reg.job(name="thumbs")
    def make_thumbnail(job: Thumbnail, ctx: JobContext) -> None:
        got.append(job)

    @reg.job
    async def resize_avatar(job: ResizeAvatar, ctx: JobContext) -> None:
        got.append(job)

    async with pipeline.open_pipeline(config, reg) as p:
        (thumb_id,) = await p.emit(Uploaded("m7"))
        avatar_id = await p.enqueue(ResizeAvatar("u1", 256))
        for job_id in (thumb_id, avatar_id):
            await wait_status(p, job_id, "completed")
    assert sorted(got, key=repr) == [ResizeAvatar("u1", 256), Thumbnail("m7", [64])]


async def test_the_example_in_docs_jobs_md_declares_and_runs(config: Config) -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "jobs.md").read_text()
    example = text.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, typing.Any] = {"__name__": "docs_jobs_example"}
    exec(compile(example, "docs/jobs.md", "exec", dont_inherit=True), namespace)  # not this module's __future__
    reg: pipeline.Registry = namespace["registry"]
    assert reg.job_types() == ["resize_avatar", "send_report"]
    assert (reg.spec("resize_avatar").concurrency, reg.spec("send_report").sync) == (4, True)
    async with pipeline.open_pipeline(config, reg) as p:
        ids = [await p.enqueue(namespace["ResizeAvatar"]("u42")),
               await p.enqueue(namespace["SendReport"]("acme", ["a@example.org"]))]
        jobs = [await wait_status(p, job_id, "completed", "dead") for job_id in ids]
    assert [(job.status, job.attempts) for job in jobs] == [("completed", 1), ("completed", 1)]
