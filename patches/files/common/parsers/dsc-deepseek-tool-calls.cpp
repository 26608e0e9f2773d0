// deepseek-cpu: tool calls and JSON-schema replies for the chat templates of DeepSeek-V2.5, V3, R1 and V3.1.
//
// Those templates write an assistant's tool calls as
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>
//   [\n<｜tool▁call▁begin｜>... more calls ...]<｜tool▁calls▁end｜>
// (V3.1: <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>, no type and no fence)
// and tool results as <｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>...<｜tool▁output▁end｜>..., but they
// never describe the tools themselves, and they render a call only when the message's content is null.
// llama.cpp's template probe therefore finds no tool support in them, and its generic path ignored
// `tools` and `tool_choice` (a "required" call came back as free text). This handler:
//   - renders the conversation with the template exactly as transformers does (tools are not described
//     to the model, because the template does not; callers who want them described put them in a
//     system message), with null content kept null on messages that carry tool calls;
//   - constrains the reply with a grammar built from the tools' JSON schemas: the whole reply for
//     tool_choice "required" (a named function arrives here as "required" with only that tool), lazily
//     from <｜tool▁calls▁begin｜> on for "auto";
//   - parses the calls back (streaming included) into OpenAI tool_calls;
//   - for response_format, constrains the reply to the schema's JSON.
// R1's templates open a <think> block in the generation prompt; its reasoning is parsed when the
// server extracts reasoning. V3.1's opens it in thinking mode and closes it (<think></think>) in
// non-thinking mode, chosen by the template's `thinking` (else `enable_thinking`) variable: the
// reply is a thought first exactly when the rendered prompt left <think> open, and nothing but
// the answer (a call, the schema's JSON) when it closed it.

#include "parsers.h"

static const char * const DSC_TC_CALLS_BEGIN = "<｜tool▁calls▁begin｜>";
static const char * const DSC_TC_CALLS_END   = "<｜tool▁calls▁end｜>";
static const char * const DSC_TC_CALL_BEGIN  = "<｜tool▁call▁begin｜>";
static const char * const DSC_TC_CALL_END    = "<｜tool▁call▁end｜>";
static const char * const DSC_TC_SEP         = "<｜tool▁sep｜>";

// the fenced markup of V2.5 / V3 / R1 (V3.1 writes NAME<｜tool▁sep｜>ARGS, without type and fence)
static bool dsc_fenced_arguments(const std::string & src) {
    return src.find("```json") != std::string::npos;
}

bool dsc_is_deepseek_tool_call_template(const std::string & src) {
    // V2.5 / V3 / R1 / V3.1; V3.2 and V4 (DSML markup) have their own handler, checked before this
    return src.find(DSC_TC_CALLS_BEGIN) != std::string::npos && src.find(DSC_TC_SEP) != std::string::npos;
}

// the template tests `message['content'] is none` to render tool calls; the server has turned a
// missing content into "" by then, which would drop the calls from the prompt
static json dsc_null_content_of_tool_call_messages(const json & messages) {
    json out = messages;
    for (auto & m : out) {
        if (m.is_object() && m.contains("tool_calls") && m.at("tool_calls").is_array() && !m.at("tool_calls").empty()) {
            const auto & c = m.contains("content") ? m.at("content") : json();
            if (c.is_null() || (c.is_string() && c.get<std::string>().empty())) {
                m["content"] = nullptr;
            }
        }
    }
    return out;
}

common_chat_params dsc_chat_params_init_deepseek_tool_calls(const common_chat_template & tmpl,
                                                            const autoparser::generation_params & inputs) {
    common_chat_params data;

    // a template that cannot take a null content (R1-0528's tests `'</think>' in content` on every
    // assistant message) raises on it: it gets the messages as the server made them (transformers,
    // too, renders R1-0528 only with a string there)
    json messages = dsc_null_content_of_tool_call_messages(inputs.messages);
    try {
        data.prompt = common_chat_template_direct_apply_impl(tmpl, inputs, messages);
    } catch (const std::exception &) {
        if (messages == inputs.messages) {
            throw;
        }
        messages    = inputs.messages;
        data.prompt = common_chat_template_direct_apply_impl(tmpl, inputs, messages);
    }
    data.generation_prompt = common_chat_template_generation_prompt_impl(tmpl, inputs, messages);
    data.format            = COMMON_CHAT_FORMAT_PEG_NATIVE;
    data.preserved_tokens  = { DSC_TC_CALLS_BEGIN, DSC_TC_CALLS_END, DSC_TC_CALL_BEGIN, DSC_TC_CALL_END, DSC_TC_SEP };
    data.message_delimiters = {
        { COMMON_CHAT_ROLE_ASSISTANT, "<｜Assistant｜>" },
        { COMMON_CHAT_ROLE_USER, "<｜User｜>" },
    };

    const std::string THINK_START = "<think>";
    const std::string THINK_END   = "</think>";
    const bool thinks = tmpl.source().find(THINK_END) != std::string::npos;
    if (thinks) {
        data.supports_thinking  = true;
        data.thinking_start_tag = THINK_START;
        data.thinking_end_tags  = { THINK_END };
        data.preserved_tokens.push_back(THINK_START);
        data.preserved_tokens.push_back(THINK_END);
    }

    const bool has_tools           = inputs.tools.is_array() && !inputs.tools.empty();
    const bool has_response_format = inputs.json_schema.is_object();
    const bool call_tools          = has_tools && inputs.tool_choice != COMMON_CHAT_TOOL_CHOICE_NONE;
    const bool require_tools       = call_tools && inputs.tool_choice == COMMON_CHAT_TOOL_CHOICE_REQUIRED;
    const bool extract_reasoning   = thinks && inputs.reasoning_format != COMMON_REASONING_FORMAT_NONE;
    // the thought is open when the prompt's last <think> has no </think> after it (R1, V3.1 thinking),
    // closed when it has (V3.1 non-thinking: <think></think>); else the model may open one (R1)
    const size_t last_think_start  = data.generation_prompt.rfind(THINK_START);
    const bool prompt_opens_think  = last_think_start != std::string::npos &&
                                     data.generation_prompt.find(THINK_END, last_think_start) == std::string::npos;
    const bool prompt_closes_think = last_think_start != std::string::npos && !prompt_opens_think;
    const bool fenced              = dsc_fenced_arguments(tmpl.source());

    auto parser = build_chat_peg_parser([&](common_chat_peg_builder & p) {
        auto start = p.literal(data.generation_prompt);
        auto end   = p.end();

        common_peg_parser reasoning = p.eps();
        if (extract_reasoning && !prompt_closes_think) {
            reasoning = prompt_opens_think ?
                p.optional(p.reasoning(p.until(THINK_END)) + p.literal(THINK_END) + p.space()) :
                p.optional(p.literal(THINK_START) + p.reasoning(p.until(THINK_END)) + p.literal(THINK_END) + p.space());
        }

        if (has_response_format && !call_tools) {
            return start + reasoning +
                   p.content(p.schema(p.json(), "response-format-schema", inputs.json_schema)) + p.space() + end;
        }
        if (!call_tools) {
            return start + reasoning + p.content(p.rest()) + end;
        }

        auto one_call = p.choice();
        foreach_function(inputs.tools, [&](const json & tool) {
            const auto &      function = tool.at("function");
            const std::string name     = function.at("name");
            auto args = p.tool_args(p.schema(p.json(), "tool-" + name + "-schema", common_chat_tool_parameters(function)));
            one_call |= p.rule("tool-" + name, fenced ?
                p.tool(p.tool_open(p.literal(DSC_TC_CALL_BEGIN) + p.literal("function") + p.literal(DSC_TC_SEP) +
                                   p.tool_name(p.literal(name)) + p.literal("\n```json\n")) +
                       args + p.tool_close(p.space() + p.literal("```") + p.literal(DSC_TC_CALL_END))) :
                p.tool(p.tool_open(p.literal(DSC_TC_CALL_BEGIN) + p.tool_name(p.literal(name)) + p.literal(DSC_TC_SEP)) +
                       args + p.tool_close(p.literal(DSC_TC_CALL_END))));
        });

        auto more  = inputs.parallel_tool_calls ? p.repeat(p.space() + one_call, 0, -1) : p.eps();
        auto calls = p.trigger_rule("tool-calls",
            p.literal(DSC_TC_CALLS_BEGIN) + one_call + more + p.optional(p.literal(DSC_TC_CALLS_END)));

        if (require_tools) {
            return start + reasoning + calls + p.space() + end;
        }
        return start + reasoning + p.content(p.until(DSC_TC_CALLS_BEGIN)) + p.optional(calls) + p.space() + end;
    });

    data.parser = parser.save();

    if (call_tools || has_response_format) {
        data.grammar_lazy = call_tools && !require_tools;
        data.grammar      = build_grammar([&](const common_grammar_builder & builder) {
            parser.build_grammar(builder, data.grammar_lazy);
        });
        if (data.grammar_lazy) {
            data.grammar_triggers = { { COMMON_GRAMMAR_TRIGGER_TYPE_WORD, DSC_TC_CALLS_BEGIN } };
        }
    }
    return data;
}
