// Chat templates: recognising the family of a model's template, and each family's exact output.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "loader/gguf.h"
#include "llm/chat_template.h"
#include "llm/vocab.h"
#include "runtime/log.h"
#include "tests/test_models.h"

using namespace troupe;
using llm::chat_message;
using llm::chat_template;
using llm::chat_template_kind;

namespace {

// SmolLM2-135M-Instruct's tokenizer.chat_template, as stored in its GGUF (real newlines in the literals).
const std::string smollm2_template =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>"
    "' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt "
    "%}{{ '<|im_start|>assistant\n' }}{% endif %}";

// The system part of a Qwen2.5-style template, with \n written as Jinja escapes.
const std::string qwen_template =
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}";

const std::string llama3_template =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

// Llama-2-chat's template (abridged): <<SYS>>, bos_token + '[INST] ' and content.strip().
const std::string llama2_template =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
    "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif "
    "%}{% for message in loop_messages %}{% if loop.index0 == 0 and system_message != false %}{% set content = "
    "'<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = "
    "message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + "
    "' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif "
    "%}{% endfor %}";

const std::string gemma_template =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | "
    "trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}";

const std::vector<chat_message> conversation = {
    {"system", " Be brief. "},
    {"user", " Hi "},
    {"assistant", "Hello!"},
    {"user", "Bye"},
};

// Log messages at warn or above while alive.
class log_capture {
 public:
  log_capture() {
    set_log_sink([this](log_level l, std::string_view m) {
      if (l >= log_level::warn) messages.emplace_back(m);
    });
  }
  ~log_capture() { set_log_sink({}); }
  std::vector<std::string> messages;
};

}  // namespace

TEST_CASE("chat template: detection", "[chat]") {
  CHECK(llm::detect_chat_template(smollm2_template) == chat_template_kind::chatml);
  CHECK(llm::detect_chat_template(qwen_template) == chat_template_kind::chatml);
  CHECK(llm::detect_chat_template(llama3_template) == chat_template_kind::llama3);
  CHECK(llm::detect_chat_template(llama2_template) == chat_template_kind::llama2_sys_strip);
  CHECK(llm::detect_chat_template("{{ '[INST] ' + m }} <<SYS>>") == chat_template_kind::llama2_sys);
  CHECK(llm::detect_chat_template("{{ bos_token + '[INST] ' }} <<SYS>>") == chat_template_kind::llama2_sys_bos);
  CHECK(llm::detect_chat_template("{{ '[INST] ' + m }}") == chat_template_kind::llama2);
  CHECK(llm::detect_chat_template(gemma_template) == chat_template_kind::gemma);
  CHECK(llm::detect_chat_template("llama3") == chat_template_kind::llama3);
  CHECK(llm::detect_chat_template("chatml") == chat_template_kind::chatml);
  CHECK(llm::detect_chat_template("gemma") == chat_template_kind::gemma);
  // Families troupe does not format.
  CHECK(llm::detect_chat_template("<|im_start|>{{ role }}<|im_sep|>") == chat_template_kind::unknown);  // Phi-4
  CHECK(llm::detect_chat_template("[SYSTEM_PROMPT] [INST]") == chat_template_kind::unknown);          // Mistral v7
  CHECK(llm::detect_chat_template("{{ messages }}") == chat_template_kind::unknown);
  CHECK(llm::detect_chat_template("") == chat_template_kind::unknown);
  CHECK(llm::chat_template_name(chat_template_kind::llama2_sys_bos) == "llama2-sys-bos");
}

TEST_CASE("chat template: ChatML", "[chat]") {
  const chat_template t("chatml");
  CHECK(t.kind() == chat_template_kind::chatml);
  CHECK_FALSE(t.fell_back());
  CHECK(t.default_system().empty());
  CHECK(t.apply(conversation, true) ==
        "<|im_start|>system\n Be brief. <|im_end|>\n"
        "<|im_start|>user\n Hi <|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n");
  CHECK(t.apply(std::vector<chat_message>{{"user", "Hi"}}, false) == "<|im_start|>user\nHi<|im_end|>\n");
  CHECK(t.apply(std::vector<chat_message>{}, true) == "<|im_start|>assistant\n");
}

TEST_CASE("chat template: SmolLM2's default system message", "[chat]") {
  const chat_template t(smollm2_template);
  CHECK(t.kind() == chat_template_kind::chatml);
  CHECK(t.default_system() == "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  CHECK(t.apply(std::vector<chat_message>{{"user", "Hi"}}, true) ==
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n");
  // A system message of the chat's own replaces it.
  CHECK(t.apply(std::vector<chat_message>{{"system", "Be brief."}, {"user", "Hi"}}, false) ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  const chat_template q(qwen_template);
  CHECK(q.default_system() == "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
}

TEST_CASE("chat template: Llama 3", "[chat]") {
  const chat_template t(llama3_template);
  CHECK(t.kind() == chat_template_kind::llama3);
  CHECK(t.name() == "llama3");
  CHECK(t.apply(conversation, true) ==
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(t.apply(std::vector<chat_message>{{"user", "Hi"}}, false) ==
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
}

TEST_CASE("chat template: Llama 2", "[chat]") {
  const chat_template strip(llama2_template);
  CHECK(strip.apply(conversation, true) ==
        "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]Hello!</s>[INST] Bye [/INST]");
  const chat_template sys("llama2-sys");
  CHECK(sys.apply(conversation, true) ==
        "[INST] <<SYS>>\n Be brief. \n<</SYS>>\n\n Hi  [/INST]Hello!</s>[INST] Bye [/INST]");
  const chat_template bos("llama2-sys-bos");
  CHECK(bos.apply(conversation, true) ==
        "[INST] <<SYS>>\n Be brief. \n<</SYS>>\n\n Hi  [/INST]Hello!</s><s>[INST] Bye [/INST]");
  const chat_template plain("llama2");
  CHECK(plain.apply(conversation, true) == "[INST]  Be brief. \n Hi  [/INST]Hello!</s>[INST] Bye [/INST]");
}

TEST_CASE("chat template: Gemma", "[chat]") {
  const chat_template t(gemma_template);
  CHECK(t.kind() == chat_template_kind::gemma);
  CHECK(t.apply(conversation, true) ==
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n");
  CHECK(t.apply(std::vector<chat_message>{{"user", "Hi"}}, false) == "<start_of_turn>user\nHi<end_of_turn>\n");
}

TEST_CASE("chat template: unknown templates fall back to ChatML with a warning", "[chat]") {
  log_capture log;
  const chat_template t("{% for m in messages %}{{ m.role }}: {{ m.content }}{% endfor %}");
  CHECK(t.kind() == chat_template_kind::chatml);
  CHECK(t.fell_back());
  REQUIRE(log.messages.size() == 1);
  CHECK_THAT(log.messages[0], Catch::Contains("not recognised") && Catch::Contains("ChatML"));
  CHECK(t.apply(std::vector<chat_message>{{"user", "Hi"}}, true) ==
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  const chat_template phi4("<|im_start|>{{ role }}<|im_sep|>");
  CHECK(phi4.fell_back());
  CHECK(log.messages.size() == 2);
}

TEST_CASE("chat template: from the models' GGUF files", "[chat][models]") {
  if (const auto path = test::model_path("stories260K.gguf")) {
    log_capture log;
    const chat_template t(read_gguf(*path));  // no tokenizer.chat_template
    CHECK(t.fell_back());
    CHECK(t.kind() == chat_template_kind::chatml);
    REQUIRE(log.messages.size() == 1);
    CHECK_THAT(log.messages[0], Catch::Contains("no tokenizer.chat_template"));
  }
  if (const auto path = test::smollm2_path()) {
    const gguf_file f = read_gguf(*path);
    const chat_template t(f);
    CHECK(t.kind() == chat_template_kind::chatml);
    CHECK_FALSE(t.fell_back());
    CHECK(t.default_system() == "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
    // The prompt tokenizes with the control tokens as single tokens.
    const llm::vocab v(f);
    const std::vector<llm::token_id> ids = v.tokenize(t.apply(std::vector<chat_message>{{"user", "Hi"}}, true),
                                                      true, true);
    CHECK(ids.front() == 1);  // <|im_start|>
    CHECK(std::count(ids.begin(), ids.end(), 1) == 3);
    CHECK(std::count(ids.begin(), ids.end(), 2) == 2);  // <|im_end|>
  }
}

TEST_CASE("chat template: raw (no markup) and templates chosen by name", "[chat]") {
  const chat_template raw = chat_template::named("raw");
  CHECK(raw.kind() == chat_template_kind::raw);
  const std::vector<chat_message> one = {{"user", "Once upon a time"}};
  CHECK(raw.apply(one, true) == "Once upon a time");
  const std::vector<chat_message> two = {{"system", "Be kind."}, {"user", "Hello"}};
  CHECK(raw.apply(two, true) == "Be kind.\nHello");
  CHECK(llm::detect_chat_template("{{ raw }}") == chat_template_kind::unknown);  // a name, never detected in a template
  CHECK(chat_template::named("llama3").kind() == chat_template_kind::llama3);
  CHECK_THROWS_WITH(chat_template::named("jinja"), Catch::Matchers::Contains("unknown chat template 'jinja'") &&
                                                       Catch::Matchers::Contains("raw"));
}
