"""The conversation entity: Home Assistant's ConversationInput and LLM API
tools in, one Parley turn, a ConversationResult out.  All the work is in the
parley binding; this file only maps fields."""
from __future__ import annotations

from typing import Literal

from homeassistant.components import conversation
from homeassistant.config_entries import ConfigEntry
from homeassistant.const import MATCH_ALL
from homeassistant.core import HomeAssistant
from homeassistant.helpers import intent, llm

from . import CONF_LLM_HASS_API, CONF_PROMPT, DOMAIN
from .parley import Agent, ParleyError, ToolCall, tool


async def async_setup_entry(hass: HomeAssistant, entry: ConfigEntry, async_add_entities) -> None:
    async_add_entities([ParleyConversationEntity(entry)])


def ha_tools(llm_api: llm.APIInstance) -> dict:
    """The HA LLM API's tools as Parley tool callables: the declaration is the
    tool's description and its voluptuous schema as JSON Schema; a call runs
    the tool through the API (errors become tool errors the model sees)."""
    from voluptuous_openapi import convert  # a Home Assistant dependency

    def make(ha_tool: llm.Tool):
        async def run(call: ToolCall):
            return await llm_api.async_call_tool(
                llm.ToolInput(tool_name=ha_tool.name, tool_args=call.arguments, id=call.call_id))
        schema = convert(ha_tool.parameters, custom_serializer=llm_api.custom_serializer)
        return tool(ha_tool.description, schema)(run)

    return {t.name: make(t) for t in llm_api.tools}


def turn_fields(user_input: conversation.ConversationInput, chat_log: conversation.ChatLog) -> dict:
    """Parley's input fields for this turn.  The system prompt HA rendered
    (prompt template, LLM API prompt, user_input.extra_system_prompt) becomes
    the turn's extra_system_prompt; Parley's own prompt option is empty."""
    system = chat_log.content[0] if chat_log.content else None
    fields = {
        "language": user_input.language,
        "device_id": user_input.device_id,
        "satellite_id": user_input.satellite_id,
        "agent_id": user_input.agent_id,
        "extra_system_prompt": (system.content if system is not None and system.role == "system"
                                else user_input.extra_system_prompt),
    }
    user_id = user_input.context.user_id if user_input.context else None
    if user_id:
        fields["context"] = {"user_id": user_id}
    if chat_log.llm_api:
        fields["tools"] = ha_tools(chat_log.llm_api)
    return fields


class ParleyConversationEntity(conversation.ConversationEntity):
    _attr_has_entity_name = True
    _attr_name = None
    _attr_supports_streaming = True

    def __init__(self, entry: ConfigEntry) -> None:
        self.entry = entry
        self._attr_unique_id = entry.entry_id
        data = {**entry.data, **entry.options}
        self._llm_hass_api = data.get(CONF_LLM_HASS_API)
        self._prompt = data.get(CONF_PROMPT)
        self._stream = bool(data.get("stream"))
        if self._llm_hass_api:
            self._attr_supported_features = conversation.ConversationEntityFeature.CONTROL

    @property
    def supported_languages(self) -> list[str] | Literal["*"]:
        return MATCH_ALL

    async def _async_handle_message(
        self, user_input: conversation.ConversationInput, chat_log: conversation.ChatLog
    ) -> conversation.ConversationResult:
        agent: Agent = self.entry.runtime_data
        try:
            await chat_log.async_provide_llm_data(user_input.as_llm_context(DOMAIN),
                                                  self._llm_hass_api, self._prompt,
                                                  user_input.extra_system_prompt)
        except conversation.ConverseError as err:
            return err.as_conversation_result()

        fields = turn_fields(user_input, chat_log)
        response = intent.IntentResponse(language=user_input.language)
        try:
            if self._stream:
                result = await self._streamed(agent, user_input, chat_log, fields)
            else:
                # HA's conversation id keys Parley's history for this conversation.
                result = await agent.process(user_input.text, chat_log.conversation_id, **fields)
                chat_log.async_add_assistant_content_without_tools(
                    conversation.AssistantContent(agent_id=user_input.agent_id,
                                                  content=result.response))
        except ParleyError as err:
            response.async_set_error(intent.IntentResponseErrorCode.UNKNOWN,
                                     "The assistant failed (%s): %s" % (err.status, err.message))
            return conversation.ConversationResult(response=response,
                                                   conversation_id=chat_log.conversation_id)
        response.async_set_speech(result.response)
        return conversation.ConversationResult(
            response=response, conversation_id=chat_log.conversation_id,
            continue_conversation=result.continue_conversation)

    async def _streamed(self, agent, user_input, chat_log, fields):
        """Text deltas go to the chat log as they come (HA starts speaking
        early); returns the Result."""
        results = []

        async def deltas():
            yield {"role": "assistant"}
            async for item in agent.stream(user_input.text, chat_log.conversation_id, **fields):
                if isinstance(item, str):
                    yield {"content": item}
                else:
                    results.append(item)

        async for _content in chat_log.async_add_delta_content_stream(user_input.agent_id,
                                                                       deltas()):
            pass
        return results[-1]
