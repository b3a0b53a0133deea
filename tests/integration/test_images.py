"""Images in a turn (input images_json; shim "images"): what reaches the
model, what history keeps (history_images), what is refused; personas and
placeholders across a restart on the SQLite store.

Everything is asserted from the fake server's request log and the shim's
history ops."""
import base64
import os
import tempfile
import unittest

from harness import FakeLLM, ParleyTestCase, fake_reply, messages, options, run_shim

PNG = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + bytes(2000)
JPEG = b"\xff\xd8\xff\xe0\0\x10JFIF\0" + bytes(300)


def data_url(mime, data):
    return "data:%s;base64,%s" % (mime, base64.b64encode(data).decode())


def parts(text, *urls):
    return [{"type": "text", "text": text}] + [
        {"type": "image_url", "image_url": {"url": u}} for u in urls]


def user(content):
    return {"role": "user", "content": content}


def assistant(text):
    return {"role": "assistant", "content": text}


SYS = {"role": "system", "content": "You are a test assistant."}
PLACEHOLDER = "what is this?\n[image: image/png, 2 KB]\n[image: https://example.com/door.jpg]"


class ImageCase(ParleyTestCase):
    maxDiff = None

    def setUp(self):
        self.llm = FakeLLM()
        self.addCleanup(self.llm.close)


class Placeholders(ImageCase):
    def test_images_reach_the_request_and_history_keeps_placeholders(self):
        png = data_url("image/png", PNG)
        run = self.run_ok([
            {"text": "what is this?", "conversation_id": "i",
             "images": [{"url": png}, {"url": "https://example.com/door.jpg"}]},
            {"text": "and now?", "conversation_id": "i"},
            {"op": "history", "conversation_id": "i"},
        ], options(self.llm))
        self.assertTurnOk(run.by_seq(1))
        self.assertTurnOk(run.by_seq(2))
        r1, r2 = self.llm.chat_requests()
        # the turn with the images sends them as content parts
        self.assertEqual(messages(r1), [SYS, user(parts("what is this?", png,
                                                        "https://example.com/door.jpg"))])
        # later turns carry the placeholder, never the image bytes
        a1 = fake_reply("what is this?", 2, 1)
        self.assertEqual(messages(r2), [SYS, user(PLACEHOLDER), assistant(a1), user("and now?")])
        turns = run.by_seq(3)["result"]["turns"]
        self.assertEqual(turns[0]["messages"], [user(PLACEHOLDER), assistant(a1)])

    def test_keep_stores_and_resends_the_image(self):
        jpg = data_url("image/jpeg", JPEG)
        run = self.run_ok([
            {"text": "look", "conversation_id": "k", "images": [{"url": jpg}]},
            {"text": "again", "conversation_id": "k"},
        ], options(self.llm, history_images="keep"))
        self.assertTurnOk(run.by_seq(2))
        r2 = self.llm.chat_requests()[1]
        self.assertEqual(messages(r2)[1], user(parts("look", jpg)))

    def test_credentials_and_tokens_of_an_image_url_are_never_kept(self):
        # Home Assistant's camera proxy: a token in the query, maybe user:pw@.
        cam = "https://user:pw@ha.local/api/camera_proxy/camera.door?token=f00dfeed#x"
        shown = "https://ha.local/api/camera_proxy/camera.door"
        jpg = data_url("image/jpeg", JPEG)
        for mode in ("placeholder", "keep"):
            conv = "cam-" + mode
            run = self.run_ok([
                {"text": "who is there?", "conversation_id": conv,
                 "images": [{"url": cam}, {"url": jpg}]},
                {"text": "and now?", "conversation_id": conv},
                {"op": "history", "conversation_id": conv},
            ], options(self.llm, history_images=mode))
            self.assertTurnOk(run.by_seq(2))
            r1, r2 = self.llm.chat_requests()[-2:]
            # this turn sends the image as given: the model's server fetches it
            self.assertEqual(messages(r1)[1], user(parts("who is there?", cam, jpg)))
            text = "who is there?\n[image: %s]" % shown
            stored = (user(text + "\n[image: image/jpeg, %d bytes]" % len(JPEG))
                      if mode == "placeholder"
                      else user(parts(text, jpg)))
            self.assertEqual(messages(r2)[1], stored)
            self.assertEqual(run.by_seq(3)["result"]["turns"][0]["messages"][0], stored)
            for line in run.raw:
                for secret in ("f00dfeed", "user:pw", "#x"):
                    self.assertNotIn(secret, line)

    def test_shim_reads_an_image_file(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "photo.bin")  # the MIME type comes from the bytes
            with open(path, "wb") as f:
                f.write(JPEG)
            run = self.run_ok([{"text": "see", "images": [{"path": path}]},
                               {"text": "see", "images": [{"path": os.path.join(d, "none")}]}],
                              options(self.llm))
        self.assertTurnOk(run.by_seq(1))
        self.assertEqual(messages(self.llm.chat_requests()[0])[1],
                         user(parts("see", data_url("image/jpeg", JPEG))))
        err = self.assertTurnError(run.by_seq(2), "invalid_input")["error"]
        self.assertIn("none: No such file", err["message"])
        self.assertEqual(len(self.llm.chat_requests()), 1)


class Providers(ImageCase):
    """Each provider's own form of a turn's images; later turns carry the placeholder."""

    def run_provider(self, provider, images, **kw):
        from test_providers import llm_requests, provider_options
        run = self.run_ok([{"text": "see", "conversation_id": "p", "images": images},
                           {"text": "more", "conversation_id": "p"}],
                          provider_options(self.llm, provider, **kw))
        return run, [r["body"] for r in llm_requests(self.llm, provider)]

    def test_anthropic_image_blocks(self):
        png = data_url("image/png", PNG)
        run, bodies = self.run_provider("anthropic", [{"url": png},
                                                      {"url": "https://example.com/door.jpg"}])
        self.assertTurnOk(run.by_seq(2))
        self.assertEqual(bodies[0]["messages"][0]["content"], [
            {"type": "text", "text": "see"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(PNG).decode()}},
            # the context engine's moving cache breakpoint sits on the request's last block
            {"type": "image", "source": {"type": "url", "url": "https://example.com/door.jpg"},
             "cache_control": {"type": "ephemeral"}}])
        self.assertEqual(bodies[1]["messages"][0]["content"], [
            {"type": "text", "text": "see\n[image: image/png, 2 KB]\n"
                                     "[image: https://example.com/door.jpg]"}])

    def test_ollama_images_and_url_refused(self):
        jpg = data_url("image/jpeg", JPEG)
        run, bodies = self.run_provider("ollama", [{"url": jpg}])
        self.assertTurnOk(run.by_seq(2))
        self.assertEqual(bodies[0]["messages"][-1],
                         {"role": "user", "content": "see",
                          "images": [base64.b64encode(JPEG).decode()]})
        self.assertEqual(bodies[1]["messages"][1],
                         {"role": "user", "content": "see\n[image: image/jpeg, %d bytes]" % len(JPEG)})
        self.assertNotIn("images", bodies[1]["messages"][1])
        from test_providers import provider_options
        run = self.run_ok([{"text": "door?", "images": [{"url": "https://cam.local/snap.jpg"}]}],
                          provider_options(self.llm, "ollama"))
        err = self.assertTurnError(run.by_seq(1), "invalid_input")["error"]
        self.assertIn("image 1: provider ollama cannot be sent an image by URL", err["message"])

    def test_ollama_keeps_images_in_history_with_keep(self):
        jpg = data_url("image/jpeg", JPEG)
        run, bodies = self.run_provider("ollama", [{"url": jpg}], history_images="keep")
        self.assertTurnOk(run.by_seq(2))
        self.assertEqual(bodies[1]["messages"][1]["images"], [base64.b64encode(JPEG).decode()])


class NoCaption(ImageCase):
    """A photo without a caption: text "" with images is a turn (no empty text part is
    sent: Anthropic refuses empty text blocks); "" without an image is still refused."""

    def test_photo_without_caption_on_every_provider(self):
        from test_providers import llm_requests, provider_options
        png = data_url("image/png", PNG)
        for provider in ("openai", "anthropic", "ollama"):
            with self.subTest(provider=provider):
                before = len(llm_requests(self.llm, provider))
                run = self.run_ok([{"text": "", "conversation_id": "n", "images": [{"url": png}]},
                                   {"text": "what was it?", "conversation_id": "n"},
                                   {"op": "history", "conversation_id": "n"}],
                                  provider_options(self.llm, provider))
                self.assertTurnOk(run.by_seq(1))
                self.assertTurnOk(run.by_seq(2))
                first, second = [r["body"] for r in llm_requests(self.llm, provider)[before:]]
                stored = run.by_seq(3)["result"]["turns"][0]["messages"][0]
                self.assertEqual(stored, user("[image: image/png, 2 KB]"))
                if provider == "openai":
                    self.assertEqual(first["messages"][-1],
                                     user([{"type": "image_url", "image_url": {"url": png}}]))
                    self.assertEqual(second["messages"][1], user("[image: image/png, 2 KB]"))
                elif provider == "anthropic":
                    self.assertEqual(first["messages"][0]["content"], [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                     "data": base64.b64encode(PNG).decode()},
                         "cache_control": {"type": "ephemeral"}}])  # the moving breakpoint
                else:
                    self.assertEqual(first["messages"][-1],
                                     {"role": "user", "content": "",
                                      "images": [base64.b64encode(PNG).decode()]})

    def test_empty_text_without_an_image_is_refused(self):
        run = self.run_ok([{"text": "", "conversation_id": "e"},
                           {"text": "", "conversation_id": "e", "images": []},
                           {"op": "history", "conversation_id": "e"}], options(self.llm))
        for seq in (1, 2):
            err = self.assertTurnError(run.by_seq(seq), "invalid_input")["error"]
            self.assertIn("input 'text'", err["message"])
        self.assertEqual(run.by_seq(3)["error"]["code"], "not_found")
        self.assertEqual(self.llm.chat_requests(), [])


class Refusals(ImageCase):
    BAD = [
        ([{"url": "data:image/png;base64,iVBOR!!"}], "image 1: the data is not valid base64"),
        ([{"url": data_url("image/png", JPEG)}], "image 1: the data is image/jpeg, not image/png"),
        ([{"url": data_url("image/bmp", b"BM" + bytes(20))}], 'type "image/bmp" is not'),
        ([{"url": "https://a.example/x.png"}, {"url": "ftp://a.example/x.png"}],
         "image 2: the URL must be data:, http: or https: (not ftp:)"),
        ([{"url": data_url("image/png", PNG)}] * 5, "5 images, more than max_images_per_turn (4)"),
        ([{"url": data_url("image/png", PNG + bytes(1000))}], "more than max_image_bytes (3000)"),
    ]

    def test_bad_images_are_refused_and_nothing_is_sent_or_stored(self):
        lines = [{"text": "first", "conversation_id": "b"},
                 {"op": "history", "conversation_id": "b"}]
        for images, _ in self.BAD:
            lines.append({"text": "bad", "conversation_id": "b", "images": images})
        lines.append({"op": "history", "conversation_id": "b"})
        run = self.run_ok(lines, options(self.llm, max_image_bytes=3000))
        for k, (_, expected) in enumerate(self.BAD):
            err = self.assertTurnError(run.by_seq(3 + k), "invalid_input")["error"]
            self.assertIn("input 'images_json': ", err["message"])
            self.assertIn(expected, err["message"])
        self.assertEqual(len(self.llm.chat_requests()), 1)
        n = len(lines)
        self.assertEqual(run.raw_result(2), run.raw_result(n))


class Restart(ImageCase):
    def test_personas_and_placeholders_survive_a_restart_on_sqlite(self):
        with tempfile.TemporaryDirectory() as d:
            self.two_runs("sqlite:" + os.path.join(d, "h.db"))

    def test_personas_and_placeholders_on_redis_across_hosts(self):
        from redis_server import RedisServer
        redis = RedisServer()
        self.addCleanup(redis.stop)
        self.two_runs(redis.url)

    def two_runs(self, history_store):
        """Two shim runs (two processes) on one store: the second sees the first's turns."""
        o = options(self.llm, history_store=history_store,
                    personas={"chef": {"prompt": "You are a chef."},
                              "butler": {"prompt": "You are a butler."}})
        png = data_url("image/png", PNG)
        self.run_ok([{"text": "c1", "conversation_id": "s", "persona": "chef",
                      "images": [{"url": png}]},
                     {"text": "b1", "conversation_id": "s", "persona": "butler"}], o)
        self.run_ok([{"text": "c2", "conversation_id": "s", "persona": "chef"},
                     {"text": "b2", "conversation_id": "s", "persona": "butler"}], o)
        reqs = self.llm.chat_requests()
        self.assertEqual(messages(reqs[2]),
                         [{"role": "system", "content": "You are a chef."},
                          user("c1\n[image: image/png, 2 KB]"),
                          assistant(fake_reply("c1", 2, 1)), user("c2")])
        self.assertEqual(messages(reqs[3]),
                         [{"role": "system", "content": "You are a butler."}, user("b1"),
                          assistant(fake_reply("b1", 2, 1)), user("b2")])


if __name__ == "__main__":
    unittest.main()
