"""The pages' forms: a trigger form built from a job's pydantic JSON schema, and the bulk
action's form fields read back.

A trigger form has one field per property of the job's payload model: a text input for a
string, a number input for an integer or a number, a checkbox for a boolean, a select for an
enum, a JSON textarea for a nested object or array (or anything else); defaults prefilled,
required ones marked, the description as help. What is posted is validated by the same
model, by the push itself (:class:`~celery_outbox.errors.PayloadInvalid`), so the form and
the API refuse the same payloads; each error is shown once, next to its field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from pydantic import BaseModel, ValidationError

JSON_FIELD = "payload"
"""The name of the one JSON textarea of a job whose payload has no properties to show."""
FORM_MAX_BYTES = 256 * 1024
"""The largest form body a page's POST reads (a bulk form of 1,000 ids is about 45 KB)."""
FORM_MAX_FIELDS = 1_100
"""The most fields a page's form body may hold (1,000 ids, the filter and the buttons)."""


@dataclass
class FormField:
    """One input of a trigger form.

    ``kind``: ``"string"``, ``"integer"``, ``"number"``, ``"boolean"``, ``"enum"`` or
    ``"json"``; ``value``: the text the input shows (the default, or what was posted);
    ``checked`` for a boolean; ``options`` for an enum (each shown as ``str(option)``);
    ``error``: the one message shown next to it ("" when none).
    """

    name: str
    kind: str
    required: bool
    label: str
    help: str = ""
    value: str = ""
    checked: bool = False
    options: list[Any] = field(default_factory=list)
    error: str = ""

    @property
    def option_texts(self) -> list[str]:
        return [_text(o) for o in self.options]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """A property's schema with ``$ref`` and ``allOf: [one]`` followed and an optional's
    ``anyOf: [X, null]`` unwrapped; and whether null is allowed."""
    nullable = False
    for _ in range(10):  # a chain of references, never a loop forever
        if "$ref" in schema:
            ref = str(schema["$ref"]).rsplit("/", 1)[-1]
            schema = {**defs.get(ref, {}), **{k: v for k, v in schema.items() if k != "$ref"}}
        elif "allOf" in schema and len(schema["allOf"]) == 1:
            schema = {**schema["allOf"][0], **{k: v for k, v in schema.items() if k != "allOf"}}
        elif "anyOf" in schema:
            others = [s for s in schema["anyOf"] if s.get("type") != "null"]
            nullable = nullable or len(others) < len(schema["anyOf"])
            if len(others) != 1:
                return {k: v for k, v in schema.items() if k != "anyOf"}, nullable
            schema = {**others[0], **{k: v for k, v in schema.items() if k != "anyOf"}}
        else:
            break
    return schema, nullable


def _kind(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return "enum"
    kind = schema.get("type")
    if kind in ("string", "integer", "number", "boolean"):
        return str(kind)
    return "json"


def schema_fields(model: type[BaseModel] | None) -> list[FormField]:
    """The inputs of a trigger form for a payload of ``model``: one per property; a single
    JSON textarea (named :data:`JSON_FIELD`) when there is no model or it has no
    properties."""
    if model is None:
        return [FormField(JSON_FIELD, "json", True, "payload",
                          "The payload, a JSON object", value="{}")]
    schema = model.model_json_schema()
    properties: dict[str, Any] = schema.get("properties") or {}
    if not properties:
        return [FormField(JSON_FIELD, "json", True, "payload",
                          schema.get("description") or "The payload, a JSON object",
                          value="{}")]
    defs: dict[str, Any] = schema.get("$defs") or {}
    required = set(schema.get("required") or ())
    out = []
    for name, raw in properties.items():
        prop, _nullable = _resolve(dict(raw), defs)
        kind = _kind(prop)
        found = FormField(name=name, kind=kind, required=name in required,
                          label=str(prop.get("title") or name),
                          help=str(prop.get("description") or ""),
                          options=list(prop.get("enum") or []))
        if "default" in prop:
            default = prop["default"]
            if kind == "boolean":
                found.checked = bool(default)
            elif kind == "json":
                found.value = json.dumps(default)
            elif default is not None:
                found.value = _text(default)
        out.append(found)
    return out


def read_payload(fields: list[FormField], form: dict[str, list[str]]) -> dict[str, Any] | Any:
    """The payload the posted ``form`` gives, each field's text kept in ``fields`` (to show
    again). A blank optional input is left out (the model's default applies); a blank
    required one too (the model then says it is required). A JSON textarea that is not JSON
    gets its error (the model could not say which of its texts it was) and is left out."""
    if len(fields) == 1 and fields[0].name == JSON_FIELD and fields[0].kind == "json":
        text = (form.get(JSON_FIELD) or [""])[0]
        fields[0].value = text
        if not text.strip():
            return None
        try:
            return json.loads(text)
        except ValueError as exc:
            attach(fields, JSON_FIELD, f"not JSON: {exc}")
            return None
    payload: dict[str, Any] = {}
    for f in fields:
        if f.kind == "boolean":
            f.checked = bool(form.get(f.name))
            payload[f.name] = f.checked
            continue
        text = (form.get(f.name) or [""])[0]
        f.value = text
        if not text.strip() and f.kind != "string":
            continue
        if not text and f.kind == "string" and not f.required:
            continue
        if f.kind == "enum":
            payload[f.name] = next((o for o in f.options if _text(o) == text), text)
        elif f.kind in ("integer", "number"):
            payload[f.name] = text.strip()  # the model parses it (lax mode), or says why not
        elif f.kind == "json":
            try:
                payload[f.name] = json.loads(text)
            except ValueError as exc:
                attach(fields, f.name, f"not JSON: {exc}")
        else:
            payload[f.name] = text
    return payload


def model_errors(fields: list[FormField], model: type[BaseModel] | None, payload: Any) -> str:
    """``payload`` validated by ``model`` (the job's; the push validates it the same way):
    each error shown once next to its field, but on a field showing an error already (a
    textarea that was not JSON); what belongs to no field comes back as one line."""
    if model is None:
        return ""
    try:
        model.model_validate(payload)
    except ValidationError as exc:
        return show_errors(fields, [dict(e) for e in exc.errors()])
    return ""


def show_errors(fields: list[FormField], errors: list[dict[str, Any]]) -> str:
    """Each of a model's errors (pydantic's ``errors()``: ``loc``, ``msg``) shown once next
    to its field (a nested one names the path below it), but on a field showing an error
    already; what belongs to no field comes back as one line for the form."""
    failed = {f.name for f in fields if f.error}
    rest: list[str] = []
    for e in errors:
        loc = [str(p) for p in e.get("loc", ())]
        message = str(e.get("msg", ""))
        if loc and loc[0] in failed:
            continue
        if loc and attach(fields, loc[0], f"{'.'.join(loc[1:])}: {message}" if loc[1:]
                          else message):
            continue
        line = f"{'.'.join(loc)}: {message}" if loc else message
        if len(fields) == 1 and fields[0].name == JSON_FIELD:
            if fields[0].name not in failed:
                attach(fields, JSON_FIELD, line)
            continue
        if line not in rest:
            rest.append(line)
    return "; ".join(rest)


def attach(fields: list[FormField], name: str, message: str) -> bool:
    """Show ``message`` next to the field ``name`` (once: a message it shows already is not
    added again); False when no field has that name."""
    for f in fields:
        if f.name == name:
            if message not in f.error.split("; "):
                f.error = f"{f.error}; {message}" if f.error else message
            return True
    return False


def read_form(raw: bytes) -> dict[str, list[str]]:
    """A urlencoded form body (at most :data:`FORM_MAX_FIELDS` fields) as lists of values.
    Raises ValueError for more fields."""
    return parse_qs(raw.decode("utf-8", "replace"), keep_blank_values=True,
                    max_num_fields=FORM_MAX_FIELDS)


__all__ = ["FORM_MAX_BYTES", "JSON_FIELD", "FormField", "attach", "model_errors",
           "read_form", "read_payload", "schema_fields", "show_errors"]
