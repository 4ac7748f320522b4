-- Chat formatting and UTF-8-safe text streaming.
local helpers = require "helpers"
local tl = require "tinyloop"

describe("tinyloop.Model", function()
    if not helpers.has_model() then
        pending("stories260K not found at " .. helpers.model_path)
        return
    end
    local model

    before_each(function()
        model = tl.Model(helpers.model_path, { max_seq_len = 256 })
    end)

    after_each(function()
        model:close()
    end)

    describe(":chat_format()", function()
        it("renders a plain transcript for a model without a chat template", function()
            assert.same("plain", model:chat_template())
            local text = model:chat_format({ { role = "system", content = "Be brief." },
                { role = "user", content = "Hi" } })
            assert.same("system: Be brief.\nuser: Hi\nassistant:", text)
        end)

        it("renders Gemma turns when told to, folding the system prompt into the first user turn", function()
            model:set_chat_template("gemma")
            local text = model:chat_format({ { role = "system", content = "Be brief." },
                { role = "user", content = "Hi" } })
            assert.same("<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n", text)
        end)

        it("renders ChatML without the assistant opening when add_assistant is false", function()
            model:set_chat_template("chatml")
            local text = model:chat_format({ { role = "user", content = "Hi" } }, { add_assistant = false })
            assert.same("<|im_start|>user\nHi<|im_end|>\n", text)
        end)

        it("renders Phi-3 and Phi-4 turns as llama.cpp's formatters do", function()
            local msgs = { { role = "system", content = "Be brief." }, { role = "user", content = "Hi" } }
            model:set_chat_template("phi3")
            assert.same("<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n", model:chat_format(msgs))
            model:set_chat_template("phi4")
            assert.same("<|im_start|>system<|im_sep|>Be brief.<|im_end|><|im_start|>user<|im_sep|>Hi<|im_end|>"
                .. "<|im_start|>assistant<|im_sep|>", model:chat_format(msgs))
        end)

        it("renders Mistral's v7, v1, v3 and v3-tekken turns as llama.cpp's formatters do", function()
            local msgs = { { role = "system", content = "Be brief." }, { role = "user", content = "Hi" },
                { role = "assistant", content = "Hello " }, { role = "user", content = "Bye" } }
            local want = {
                ["mistral-v7"] = "[SYSTEM_PROMPT] Be brief.[/SYSTEM_PROMPT][INST] Hi[/INST] Hello </s>[INST] Bye[/INST]",
                ["mistral-v1"] = " [INST] Be brief.\n\nHi [/INST] Hello </s> [INST] Bye [/INST]",
                ["mistral-v3"] = "[INST] Be brief.\n\nHi[/INST] Hello</s>[INST] Bye[/INST]",
                ["mistral-v3-tekken"] = "[INST]Be brief.\n\nHi[/INST]Hello </s>[INST]Bye[/INST]",
            }
            for name, text in pairs(want) do
                model:set_chat_template(name)
                assert.same(name, model:chat_template())
                assert.same(text, model:chat_format(msgs))
            end
        end)

        it("renders Falcon 3 and Granite turns as llama.cpp's formatters do", function()
            local msgs = { { role = "system", content = "Be brief." }, { role = "user", content = "Hi" } }
            model:set_chat_template("falcon3")
            assert.same("<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n", model:chat_format(msgs))
            model:set_chat_template("granite")
            assert.same("<|start_of_role|>system<|end_of_role|>Be brief.<|end_of_text|>\n"
                .. "<|start_of_role|>user<|end_of_role|>Hi<|end_of_text|>\n"
                .. "<|start_of_role|>assistant<|end_of_role|>\n", model:chat_format(msgs))
        end)

        it("renders DeepSeek V3 / R1 turns as llama.cpp's formatter does", function()
            local U, A, E = "<\u{FF5C}User\u{FF5C}>", "<\u{FF5C}Assistant\u{FF5C}>",
                "<\u{FF5C}end\u{2581}of\u{2581}sentence\u{FF5C}>"
            model:set_chat_template("deepseek3")
            assert.same("Be brief.\n\n" .. U .. "Hi" .. A .. "Hello" .. E .. U .. "Bye" .. A,
                model:chat_format({ { role = "system", content = "Be brief." }, { role = "user", content = "Hi" },
                    { role = "assistant", content = "Hello" }, { role = "user", content = "Bye" } }))
        end)

        it("renders Command R turns as llama.cpp's formatter does (a token for each role)", function()
            model:set_chat_template("command-r")
            local S, E = "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>"
            assert.same(S .. "<|SYSTEM_TOKEN|>Be brief." .. E .. S .. "<|USER_TOKEN|>Hi" .. E .. S
                .. "<|CHATBOT_TOKEN|>Hello" .. E .. S .. "<|USER_TOKEN|>Bye" .. E .. S .. "<|CHATBOT_TOKEN|>",
                model:chat_format({ { role = "system", content = "Be brief." }, { role = "user", content = "Hi" },
                    { role = "assistant", content = "Hello" }, { role = "user", content = "Bye" } }))
        end)

        it("rejects an unknown role naming the message", function()
            assert.has_error(function()
                model:chat_format({ { role = "robot", content = "x" } })
            end)
        end)

        it("rejects an unknown template name", function()
            assert.has_error(function() model:set_chat_template("jinja") end)
        end)
    end)

    describe(":chat()", function()
        it("answers and stops at the next turn of the transcript", function()
            local text, ids = model:chat({ { role = "user", content = "Once upon a time" } },
                { max_tokens = 24, temperature = 0 })
            assert.is_string(text)
            assert.is_true(#ids > 0)
            assert.is_nil(text:find("\nuser:", 1, true))
        end)
    end)

    describe(":register_prefix_async()", function()
        it("registers without waiting; the entry appears once the steps ran its prefill", function()
            local pool = tl.PrefixPool(2)
            local toks = model:tokenize("Once upon a time there was a little dog")
            local id = model:register_prefix_async(pool, toks)
            assert.same(0, pool:size())
            assert.same("queued", model:request_state(id))
            -- no engine thread here: any generation steps the scheduler
            model:generate(model:tokenize("Lily"), { max_tokens = 2, temperature = 0 })
            assert.same("done", model:request_state(id))
            assert.same(1, pool:size())
            assert.same(#toks, pool:total_cached_tokens())
            model:release_request(id)
            assert.is_nil(model:request_state(id))
            pool:free()
        end)

        it("rejects an empty prefix naming the argument", function()
            local pool = tl.PrefixPool(2)
            assert.has_error(function() model:register_prefix_async(pool, {}) end)
            pool:free()
        end)
    end)

    describe(":stream_close()", function()
        it("ends a stream early and releases its request at once", function()
            local next_tok, st = model:stream(model:tokenize("Once upon a time"), { max_tokens = 100, temperature = 0 })
            assert.is_number(next_tok(st))
            assert.same(1, model:stats().requests_active)
            model:stream_close(st)
            assert.same(0, model:stats().requests_active)
            assert.is_nil(next_tok(st))
        end)

        it("rejects something that is not a stream state", function()
            assert.has_error(function() model:stream_close({}) end)
        end)
    end)

    describe(":stream_text()", function()
        it("yields text whose concatenation equals the streamed tokens' pieces", function()
            local prompt = model:tokenize("Once upon a time")
            local pieces, ids = {}, {}
            for piece in model:stream_text(prompt, { max_tokens = 30, temperature = 0 }) do
                pieces[#pieces + 1] = piece
            end
            for tok in model:stream(prompt, { max_tokens = 30, temperature = 0 }) do
                ids[#ids + 1] = model:piece(tok)
            end
            assert.same(table.concat(ids), table.concat(pieces))
        end)
    end)
end)
