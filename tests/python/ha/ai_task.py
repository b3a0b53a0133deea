"""Stand-in for homeassistant/components/ai_task/ (entity.py at
021512e6b4b85ae7a580ff30075df5f672a03e21, task.py's GenDataTask and
GenDataTaskResult, const.py's AITaskEntityFeature and DEFAULT_SYSTEM_PROMPT),
home-assistant/core dev 2026 snapshot.  The task runs in a fresh chat
session whose log gets HA's AI Task system prompt and the instructions as
the user message, as AITaskEntity._async_get_ai_task_chat_log does."""
import contextlib
import dataclasses
import enum

from . import chat, core, llm

DOMAIN = "ai_task"
DEFAULT_SYSTEM_PROMPT = ("You are a Home Assistant expert and help users with their tasks.")


class AITaskEntityFeature(enum.IntFlag):
    GENERATE_DATA = 1
    SUPPORT_ATTACHMENTS = 2
    GENERATE_IMAGE = 4


@dataclasses.dataclass(slots=True)
class GenDataTask:
    name: str
    instructions: str
    structure: object = None
    attachments: list | None = None
    llm_api: object = None


@dataclasses.dataclass(slots=True)
class GenDataTaskResult:
    conversation_id: str
    data: object

    def as_dict(self):
        return {"conversation_id": self.conversation_id, "data": self.data}


def make_entity_class(restore_entity):
    class AITaskEntity(restore_entity):
        _attr_should_poll = False
        _attr_supported_features = AITaskEntityFeature(0)

        @contextlib.asynccontextmanager
        async def _async_get_ai_task_chat_log(self, session, task):
            with chat.async_get_chat_log(self.hass, session, None) as chat_log:
                await chat_log.async_provide_llm_data(
                    llm.LLMContext(platform=self.platform.domain, context=None, language=None,
                                   assistant=DOMAIN, device_id=None),
                    user_llm_prompt=DEFAULT_SYSTEM_PROMPT)
                chat_log.async_add_user_content(
                    chat.UserContent(task.instructions, attachments=task.attachments))
                yield chat_log

        async def internal_async_generate_data(self, session, task):
            self.async_write_ha_state()
            async with self._async_get_ai_task_chat_log(session, task) as chat_log:
                return await self._async_generate_data(task, chat_log)

        async def _async_generate_data(self, task, chat_log):
            raise NotImplementedError

    return AITaskEntity


async def async_generate_data(hass, *, task_name, entity_id, instructions, structure=None,
                              attachments=None, llm_api=None):
    entity = hass.config_entries.entities.get(entity_id)
    if entity is None:
        raise core.HomeAssistantError(f"AI Task entity {entity_id} not found")
    if structure is not None and not entity.supported_features & AITaskEntityFeature.GENERATE_DATA:
        raise core.HomeAssistantError("the entity does not generate data")
    with chat.async_get_chat_session(hass) as session:
        return await entity.internal_async_generate_data(
            session, GenDataTask(name=task_name, instructions=instructions, structure=structure,
                                 attachments=attachments, llm_api=llm_api))
