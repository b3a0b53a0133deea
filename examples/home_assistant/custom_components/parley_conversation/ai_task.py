"""The AI Task entity: ai_task.generate_data through one stateless Parley
turn.  With a structure, the turn carries it as its response format (a JSON
schema Parley asks the provider for and checks the answer against), and the
data is the parsed JSON."""
from __future__ import annotations

import base64
import json
import re

from homeassistant.components import ai_task, conversation
from homeassistant.config_entries import ConfigEntry
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import llm

from .const import SUBENTRY_AI_TASK
from .entity import ParleyEntity
from .parley import ParleyError
from .turns import Turn, tool_schema


async def async_setup_entry(hass: HomeAssistant, entry: ConfigEntry, async_add_entities) -> None:
    for subentry in entry.subentries.values():
        if subentry.subentry_type == SUBENTRY_AI_TASK:
            async_add_entities([ParleyTaskEntity(entry, subentry)],
                               config_subentry_id=subentry.subentry_id)


def strict(schema: dict) -> set:
    """Make a JSON schema strict, in place, as HA's OpenAI agent does for
    structured output (strict mode wants every property required and no
    others): an optional property becomes required and nullable.  Returns
    the optional names of the top object (their nulls are dropped again)."""
    optional = set()
    if schema.get("type") == "object" and "properties" in schema:
        required = schema.setdefault("required", [])
        for name, prop in schema["properties"].items():
            strict(prop)
            if name not in required:
                optional.add(name)
                required.append(name)
                if isinstance(prop.get("type"), str):
                    prop["type"] = [prop["type"], "null"]
        schema["additionalProperties"] = False
    elif schema.get("type") == "array" and isinstance(schema.get("items"), dict):
        strict(schema["items"])
    return optional


def response_format(task: ai_task.GenDataTask, chat_log) -> tuple[dict, set]:
    """Parley's response format for a task's structure (its JSON schema, named
    after the task, strict) and the structure's optional keys."""
    serializer = (chat_log.llm_api.custom_serializer if chat_log.llm_api
                  else llm.selector_serializer)
    name = re.sub(r"[^a-zA-Z0-9_-]", "_", task.name)[:64] or "response"
    schema = tool_schema(task.structure, serializer)
    optional = strict(schema)
    return {"name": name, "schema": schema, "strict": True}, optional


def _images(attachments) -> list:
    """Image attachments as data URLs (blocking: reads the files)."""
    images = []
    for attachment in attachments or ():
        if not attachment.mime_type.startswith("image/"):
            raise HomeAssistantError("Parley only takes image attachments, not %s"
                                     % attachment.mime_type)
        raw = base64.b64encode(attachment.path.read_bytes()).decode()
        images.append({"url": "data:%s;base64,%s" % (attachment.mime_type, raw)})
    return images


class ParleyTaskEntity(ai_task.AITaskEntity, ParleyEntity):
    _attr_supported_features = (ai_task.AITaskEntityFeature.GENERATE_DATA
                                | ai_task.AITaskEntityFeature.SUPPORT_ATTACHMENTS)

    async def _async_generate_data(self, task: ai_task.GenDataTask,
                                   chat_log: conversation.ChatLog) -> ai_task.GenDataTaskResult:
        fields = {"extra_system_prompt": chat_log.content[0].content or None}
        optional = set()
        if task.structure:
            fields["response_format"], optional = response_format(task, chat_log)
        if task.attachments:
            fields["images"] = await self.hass.async_add_executor_job(_images, task.attachments)
        turn = Turn(chat_log, self.entity_id, streaming=False)
        if tools := turn.tools():
            fields["tools"] = tools
        try:
            result = await self.handle.agent.process(task.instructions, None, **fields)
        except ParleyError as err:
            raise HomeAssistantError("Parley could not do the task (%s): %s"
                                     % (err.status, err.message)) from err
        turn.write_steps(result.steps, [])
        if not task.structure:
            return ai_task.GenDataTaskResult(conversation_id=chat_log.conversation_id,
                                             data=result.response)
        data = getattr(result, "structured", None)
        if data is None:  # a plugin older than structured output: parse the answer
            try:
                data = json.loads(result.response)
            except ValueError as err:
                raise HomeAssistantError("The answer is not JSON: %s" % result.response) from err
        if isinstance(data, dict):  # an optional key the strict schema made null: absent
            data = {k: v for k, v in data.items() if not (v is None and k in optional)}
        return ai_task.GenDataTaskResult(conversation_id=chat_log.conversation_id, data=data)
