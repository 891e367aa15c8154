"""The daemon driven by the official `anthropic` Python client (PyPI), as Claude-style agents drive it.

Starts a real `troupe serve --config configs/daemon.toml` (port 0, one API key, the fetched SmolLM2) and
checks Anthropic's Messages API as troupe implements it: a reply, a streamed reply whose events arrive in
the documented order and add up to the reply, a tool_use round trip (tool_use block, then a tool_result
answered), count_tokens equal to the prompt tokens a reply used, stop_sequences, and errors in Anthropic's
shape (400 for a bad body, 401 for a wrong x-api-key). Run by CTest (`api: anthropic client`) with the
project's virtual environment; exit 77 (skipped) without the model or the client, except under CI=true.
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_openai_client as common  # noqa: E402  (the Daemon helper and the skip rules)

ARGS = None
KEY = "anthropic-test-key"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {"name": "get_weather", "description": "Current weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


class AnthropicClient(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import anthropic
        cls.daemon = common.Daemon(ARGS.troupe, common.example_config(ARGS.source, ARGS.model, api_key=KEY), ARGS.source)
        cls.client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{cls.daemon.port}", api_key=KEY,
                                         max_retries=0, timeout=120)

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def create(self, **kw):
        kw.setdefault("messages", QUESTION)
        kw.setdefault("max_tokens", 40)
        kw.setdefault("temperature", 0)
        return self.client.messages.create(model="smollm2", **kw)

    def test_reply_and_count_tokens(self):
        r = self.create()
        self.assertEqual(r.type, "message")
        self.assertEqual(r.role, "assistant")
        self.assertEqual(r.model, "smollm2")
        self.assertEqual([b.type for b in r.content], ["text"])
        self.assertTrue(r.content[0].text)
        self.assertIn(r.stop_reason, ("end_turn", "max_tokens"))
        self.assertGreater(r.usage.input_tokens, 0)
        self.assertGreater(r.usage.output_tokens, 0)
        self.assertTrue(r.id.startswith("msg_"))
        counted = self.client.messages.count_tokens(model="smollm2", messages=QUESTION)
        self.assertEqual(counted.input_tokens, r.usage.input_tokens)
        # A system prompt is part of the prompt (in place of the default one SmolLM2's template writes).
        with_system = self.client.messages.count_tokens(model="smollm2", system="Answer in one word.", messages=QUESTION)
        self.assertNotEqual(with_system.input_tokens, counted.input_tokens)
        self.assertEqual(with_system.input_tokens, self.create(system="Answer in one word.", max_tokens=2).usage.input_tokens)

    def test_stream_events_in_order(self):
        plain = self.create()
        events = list(self.create(stream=True))
        types = [e.type for e in events]
        self.assertEqual(types[0], "message_start")
        self.assertEqual(types[-2:], ["message_delta", "message_stop"])
        self.assertEqual(events[0].message.usage.input_tokens, plain.usage.input_tokens)
        # Blocks: start, deltas of its index, stop; one after another.
        text, open_index, blocks = "", None, 0
        for e in events[1:-2]:
            if e.type == "ping":
                continue
            if e.type == "content_block_start":
                self.assertIsNone(open_index)
                self.assertEqual(e.index, blocks)
                open_index = e.index
            elif e.type == "content_block_delta":
                self.assertEqual(e.index, open_index)
                self.assertEqual(e.delta.type, "text_delta")
                text += e.delta.text
            elif e.type == "content_block_stop":
                self.assertEqual(e.index, open_index)
                open_index, blocks = None, blocks + 1
            else:
                self.fail("unexpected event " + e.type)
        self.assertIsNone(open_index)
        self.assertEqual(blocks, 1)
        self.assertEqual(text, plain.content[0].text)
        self.assertEqual(events[-2].delta.stop_reason, plain.stop_reason)
        self.assertEqual(events[-2].usage.output_tokens, plain.usage.output_tokens)
        # The SDK's own accumulation gives the same message.
        with self.client.messages.stream(model="smollm2", max_tokens=40, temperature=0, messages=QUESTION) as s:
            final = s.get_final_message()
        self.assertEqual(final.content[0].text, plain.content[0].text)

    def test_tool_use_round_trip(self):
        r = self.create(tools=[WEATHER], tool_choice={"type": "any"}, max_tokens=60,
                        messages=[{"role": "user", "content": "What is the weather in Paris?"}])
        self.assertEqual(r.stop_reason, "tool_use")
        uses = [b for b in r.content if b.type == "tool_use"]
        self.assertEqual(len(uses), 1)
        self.assertEqual(uses[0].name, "get_weather")
        self.assertIsInstance(uses[0].input["city"], str)
        # The call and its result go back; the model answers in text.
        follow = [{"role": "user", "content": "What is the weather in Paris?"},
                  {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "21 C, sunny"}]}]
        r2 = self.create(tools=[WEATHER], tool_choice={"type": "none"}, messages=follow)
        self.assertEqual([b.type for b in r2.content], ["text"])
        self.assertTrue(r2.content[0].text)
        self.assertNotEqual(r2.stop_reason, "tool_use")
        # Streamed, the call is a tool_use block whose input arrives as input_json_delta.
        events = list(self.create(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}, max_tokens=60,
                                  stream=True, messages=[{"role": "user", "content": "Weather in Rome?"}]))
        starts = [e for e in events if e.type == "content_block_start"]
        self.assertEqual(starts[-1].content_block.type, "tool_use")
        self.assertEqual(starts[-1].content_block.name, "get_weather")
        partial = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
        self.assertIn("city", partial)
        self.assertEqual([e for e in events if e.type == "message_delta"][0].delta.stop_reason, "tool_use")

    def test_stop_sequences(self):
        r = self.create(stop_sequences=["a"])
        self.assertEqual(r.stop_reason, "stop_sequence")
        self.assertEqual(r.stop_sequence, "a")
        self.assertNotIn("a", r.content[0].text if r.content else "")

    def test_errors_in_anthropics_shape(self):
        import anthropic
        with self.assertRaises(anthropic.BadRequestError) as e:
            self.client.messages.create(model="smollm2", max_tokens=10, messages=[
                {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
        self.assertEqual(e.exception.body["type"], "error")
        self.assertEqual(e.exception.body["error"]["type"], "invalid_request_error")
        self.assertIn("image", e.exception.body["error"]["message"])
        with self.assertRaises(anthropic.NotFoundError) as e:
            self.client.messages.create(model="no-such-model", max_tokens=10, messages=QUESTION)
        self.assertEqual(e.exception.body["error"]["type"], "not_found_error")
        bad_key = anthropic.Anthropic(base_url=f"http://127.0.0.1:{self.daemon.port}", api_key="wrong", max_retries=0)
        with self.assertRaises(anthropic.AuthenticationError) as e:
            bad_key.messages.create(model="smollm2", max_tokens=10, messages=QUESTION)
        self.assertEqual(e.exception.body["error"]["type"], "authentication_error")


def main():
    common.main_for(globals(), "anthropic")


if __name__ == "__main__":
    main()
