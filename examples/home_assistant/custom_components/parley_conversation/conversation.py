"""The conversation entity: one Parley turn per Home Assistant message.

Before the turn: HA renders its prompt and tools (async_provide_llm_data);
the stable part of the prompt becomes Parley's cached system prompt and the
rest the turn's extra_system_prompt; what HA's chat log holds that Parley did
not say is appended to the memory.  The turn runs HA's tools as Parley tool
calls; every step goes into the chat log (turns.py) and the result is built
from it with async_get_result_from_chat_log, as HA's own agents do.
"""
from __future__ import annotations

import logging
from typing import Literal

from homeassistant.components import conversation
from homeassistant.config_entries import ConfigEntry
from homeassistant.const import MATCH_ALL
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import intent

from .const import (CONF_LLM_HASS_API, CONF_MEMORY, CONF_PROMPT, CONF_STREAM, DOMAIN,
                    SUBENTRY_CONVERSATION)
from .entity import ParleyEntity
from .parley import ParleyError
from .runtime import setting
from .turns import (Turn, foreign_messages, memory_id, split_prompt, texts_before_tools,
                    trace_usage)

_LOGGER = logging.getLogger(__name__)


async def async_setup_entry(hass: HomeAssistant, entry: ConfigEntry, async_add_entities) -> None:
    for subentry in entry.subentries.values():
        if subentry.subentry_type == SUBENTRY_CONVERSATION:
            async_add_entities([ParleyConversationEntity(entry, subentry)],
                               config_subentry_id=subentry.subentry_id)


class ParleyConversationEntity(conversation.ConversationEntity, ParleyEntity):

    @property
    def supported_features(self) -> conversation.ConversationEntityFeature:
        """CONTROL while the agent may use an LLM API (a reconfigure changes it live)."""
        if self.handle.data.get(CONF_LLM_HASS_API):
            return conversation.ConversationEntityFeature.CONTROL
        return conversation.ConversationEntityFeature(0)

    @property
    def supports_streaming(self) -> bool:
        """Only when Parley streams: HA then starts speaking early."""
        return bool(setting(self.handle.data, CONF_STREAM))

    @property
    def supported_languages(self) -> list[str] | Literal["*"]:
        return MATCH_ALL

    async def _async_handle_message(
        self, user_input: conversation.ConversationInput, chat_log: conversation.ChatLog
    ) -> conversation.ConversationResult:
        handle = self.handle
        data = handle.data
        try:
            await chat_log.async_provide_llm_data(user_input.as_llm_context(DOMAIN),
                                                  data.get(CONF_LLM_HASS_API),
                                                  data.get(CONF_PROMPT),
                                                  user_input.extra_system_prompt)
        except conversation.ConverseError as err:
            return err.as_conversation_result()

        memory = memory_id(setting(data, CONF_MEMORY), user_input, chat_log.conversation_id)
        await self._sync_memory(handle, chat_log, memory)
        stable, per_turn = split_prompt(chat_log.content[0].content,
                                        chat_log.llm_api.api_prompt if chat_log.llm_api else None,
                                        chat_log.extra_system_prompt)
        fields = {"language": user_input.language, "device_id": user_input.device_id,
                  "satellite_id": user_input.satellite_id, "agent_id": user_input.agent_id,
                  "extra_system_prompt": per_turn or None}
        if user_input.context and user_input.context.user_id:
            fields["context"] = {"user_id": user_input.context.user_id}
        streaming = bool(setting(data, CONF_STREAM))
        turn = Turn(chat_log, self.entity_id, streaming)
        fields["tools"] = turn.tools()
        try:
            if streaming:
                result = await self._streamed(handle, turn, user_input.text, memory, stable,
                                              fields)
            else:
                task = await handle.begin(stable, lambda: handle.agent.process(
                    user_input.text, memory, **fields))
                result = await task
                turn.write_steps(result.steps, await texts_before_tools(handle.agent, result))
        except ParleyError as err:
            _LOGGER.warning("Parley turn failed: %s", err)
            response = intent.IntentResponse(language=user_input.language)
            response.async_set_error(intent.IntentResponseErrorCode.UNKNOWN,
                                     "The assistant failed (%s): %s" % (err.status, err.message))
            return conversation.ConversationResult(response=response,
                                                   conversation_id=chat_log.conversation_id)
        handle.remember_synced(chat_log.conversation_id, len(chat_log.content))
        trace_usage(chat_log, result.usage)
        try:
            return conversation.async_get_result_from_chat_log(user_input, chat_log)
        except HomeAssistantError as err:
            raise HomeAssistantError("Parley's answer did not reach the chat log") from err

    async def _sync_memory(self, handle, chat_log, memory: str) -> None:
        """Append to the memory what HA's chat log gained since our last turn
        that Parley did not produce, in order, without a model call."""
        start = handle.synced.get(chat_log.conversation_id, 1)
        for role, text in foreign_messages(chat_log.content, start, self.entity_id):
            try:
                await handle.agent.append_message(memory, text, role=role)
            except ParleyError as err:  # the turn still runs, without it
                _LOGGER.warning("Could not add %s message to the memory: %s", role, err)
        # Seen, also if the turn fails (HA then keeps its log without this turn).
        handle.remember_synced(chat_log.conversation_id, len(chat_log.content) - 1)

    async def _streamed(self, handle, turn: Turn, text, memory, stable, fields):
        """Deltas into the chat log as they come (HA starts speaking early);
        returns the Result."""
        pump = await handle.begin(stable, lambda: turn.pump(
            handle.agent.stream(text, memory, on_reasoning=turn.on_reasoning, **fields)))
        try:
            async for _content in turn.chat_log.async_add_delta_content_stream(
                    self.entity_id, turn.deltas()):
                pass
        finally:
            pump.cancel()
        return turn.result
