-- tinyloop.chat - chat helpers installed into tinyloop.Model: rendering
-- messages with the model's chat template, and a chat turn that stops at
-- the end of the assistant's turn.
local ffi = require "ffi"

local type, ipairs, next = type, ipairs, next
local ffi_new, ffi_string = ffi.new, ffi.string

local _M = {}


function _M.install(Model, deps)
    local C, closed, bad, raise_rc, opt_table, char_vla =
        deps.C, deps.closed, deps.bad, deps.raise_rc, deps.opt_table, deps.char_vla

    -- chat_format(messages [, { add_assistant = true }]) -> text rendered with
    -- the model's chat template (see chat_template()); messages are
    -- { role = "system" | "user" | "assistant", content = "..." }. Tokenize the
    -- result with { parse_special = true }.
    function Model:chat_format(messages, opts)
        local h = self.h or closed("chat_format", 2)
        if type(messages) ~= "table" or #messages == 0 then
            bad("chat_format", "messages", "expected a non-empty array of { role =, content = }")
        end
        local o = opt_table("chat_format", opts, 2)
        local add = o.add_assistant
        if add == nil then
            add = true
        end
        local n = #messages
        -- The strings stay alive through `messages` for the duration of the call.
        local msgs = ffi_new("tl_chat_message[?]", n)
        for i = 1, n do
            local m = messages[i]
            if type(m) ~= "table" or type(m.role) ~= "string" or type(m.content) ~= "string" then
                bad("chat_format", "messages[" .. i .. "]", "expected { role = string, content = string }")
            end
            msgs[i - 1].role = m.role
            msgs[i - 1].content = m.content
        end
        local need = C.tl_chat_format(h, msgs, n, add and 1 or 0, nil, 0)
        if need >= 0 then
            need = -(need + 1)
        end
        if -need <= 10 and need > -1 then
            raise_rc(need, "chat_format", 2)
        end
        local buf = ffi_new(char_vla, -need)
        local len = C.tl_chat_format(h, msgs, n, add and 1 or 0, buf, -need)
        if len < 0 then
            raise_rc(len, "chat_format", 2)
        end
        return ffi_string(buf, len)
    end


    -- chat_template() -> "plain" | "gemma" | "chatml" | "llama3" | "llama2";
    -- set_chat_template(name) overrides what the model's metadata implies.
    function Model:chat_template()
        local h = self.h or closed("chat_template", 2)
        return ffi_string(C.tl_model_chat_template(h))
    end


    function Model:set_chat_template(name)
        local h = self.h or closed("set_chat_template", 2)
        if type(name) ~= "string" then
            bad("set_chat_template", "name", "expected a string, got " .. type(name))
        end
        local rc = C.tl_model_set_chat_template(h, name)
        if rc ~= 0 then
            raise_rc(rc, "set_chat_template", 2)
        end
    end


    -- chat(messages, opts) -> answer text, token ids: renders the messages,
    -- generates the assistant's turn (through opts.pool when given) and stops
    -- at an end-of-turn token or at any of opts.stop (strings; for the plain
    -- transcript format "\nuser:" is added). Other opts as stream().
    function Model:chat(messages, opts)
        local _ = self.h or closed("chat", 2)
        local o = opt_table("chat", opts, 2)
        local prompt = self:tokenize(self:chat_format(messages), { parse_special = true })
        local stops = {}
        for i, s in ipairs(o.stop or {}) do
            stops[i] = s
        end
        if self:chat_template() == "plain" then
            stops[#stops + 1] = "\nuser:"
            stops[#stops + 1] = "\nsystem:"
        end
        local gen = {}
        for k, v in next, o do
            if k ~= "stop" then
                gen[k] = v
            end
        end
        local ids, text = {}, ""
        local next_tok, st = self:stream(prompt, gen)
        for tok in next_tok, st do
            ids[#ids + 1] = tok
            text = self:detokenize(ids)
            local cut
            for _, s in ipairs(stops) do
                local at = text:find(s, 1, true)
                if at and (not cut or at < cut) then
                    cut = at
                end
            end
            if cut then
                text = text:sub(1, cut - 1)
                break
            end
        end
        self:stream_close(st) -- stops generating now instead of when collected
        return (text:gsub("^%s+", ""):gsub("%s+$", "")), ids
    end
end


return _M
