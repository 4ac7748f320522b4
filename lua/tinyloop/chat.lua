-- tinyloop.chat - chat helpers installed into tinyloop.Model: rendering
-- messages with the model's chat template, and a chat turn that stops at
-- the end of the assistant's turn.
local ffi = require "ffi"
local textstream = require "tinyloop.textstream"

local type, ipairs, next, concat = type, ipairs, next, table.concat
local ffi_new, ffi_string = ffi.new, ffi.string

local _M = {}


-- The stop strings of a chat turn: opts.stop, and for the plain
-- transcript format the next turn's "\nuser:" / "\nsystem:".
function _M.stops(template, user_stops)
    local stops = {}
    for i, s in ipairs(user_stops or {}) do
        stops[i] = s
    end
    if template == "plain" then
        stops[#stops + 1] = "\nuser:"
        stops[#stops + 1] = "\nsystem:"
    end
    return stops
end


function _M.install(Model, deps)
    local C, closed, bad, raise_rc, opt_table, char_vla, open_stream =
        deps.C, deps.closed, deps.bad, deps.raise_rc, deps.opt_table, deps.char_vla, deps.open_stream

    -- The messages as a tl_chat_message array (the strings stay alive through
    -- `messages` while the array is used).
    local function c_messages(fname, messages)
        if type(messages) ~= "table" or #messages == 0 then
            bad(fname, "messages", "expected a non-empty array of { role =, content = }")
        end
        local n = #messages
        local msgs = ffi_new("tl_chat_message[?]", n)
        for i = 1, n do
            local m = messages[i]
            if type(m) ~= "table" or type(m.role) ~= "string" or type(m.content) ~= "string" then
                bad(fname, "messages[" .. i .. "]", "expected { role = string, content = string }")
            end
            if m.content:find("\0", 1, true) then
                bad(fname, "messages[" .. i .. "].content", "contains a NUL byte")
            end
            msgs[i - 1].role = m.role
            msgs[i - 1].content = m.content
        end
        return msgs, n
    end


    -- chat_tokenize(messages [, { add_assistant = true, as_cdata }]) -> ids of
    -- the conversation in the model's chat template, BOS as the vocab says.
    -- Only the template's own markers become control tokens: content such as
    -- "<end_of_turn>" stays text, so a message cannot forge a turn. The safe
    -- way to prompt with messages (chat_format + tokenize is for display).
    function Model:chat_tokenize(messages, opts)
        local h = self.h or closed("chat_tokenize", 2)
        local o = opt_table("chat_tokenize", opts, 2)
        local add = o.add_assistant
        if add == nil then
            add = true
        end
        local msgs, n = c_messages("chat_tokenize", messages)
        local need = C.tl_chat_tokenize(h, msgs, n, add and 1 or 0, nil, 0)
        if need >= 0 then
            need = -need -- nothing to write (0 ids)
        elseif need >= -10 then
            -- a status code, or a need of 1..10 ids: ask again with room
            need = -16
        end
        local buf = ffi_new("int32_t[?]", -need)
        local got = C.tl_chat_tokenize(h, msgs, n, add and 1 or 0, buf, -need)
        if got < 0 then
            raise_rc(got, "chat_tokenize", 2)
        end
        if o.as_cdata then
            return buf, got
        end
        local t = {}
        for i = 0, got - 1 do
            t[i + 1] = buf[i]
        end
        return t
    end


    -- chat_format(messages [, { add_assistant = true }]) -> text rendered with
    -- the model's chat template (see chat_template()); messages are
    -- { role = "system" | "user" | "assistant", content = "..." }. For display
    -- and logs: to prompt, use chat_tokenize (tokenizing this text with
    -- parse_special = true lets message content forge control tokens).
    function Model:chat_format(messages, opts)
        local h = self.h or closed("chat_format", 2)
        local o = opt_table("chat_format", opts, 2)
        local add = o.add_assistant
        if add == nil then
            add = true
        end
        local msgs, n = c_messages("chat_format", messages)
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


    -- chat_template() -> "plain" | "gemma" | "chatml" | "llama3" | "llama2" | "phi3" | "phi4" |
    -- "mistral-v7" | "mistral-v1" | "mistral-v3" | "mistral-v3-tekken" | "falcon3" | "granite" |
    -- "deepseek3" | "command-r";
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
    -- transcript format "\nuser:" is added). Other opts as stream(). Text is
    -- cut by tinyloop.textstream, the decoder of stream_text and the server.
    -- A request that cannot be submitted (the queue is busy, out of memory)
    -- returns nil, err, code; a failure mid-generation raises, as in stream.
    function Model:chat(messages, opts)
        local _ = self.h or closed("chat", 2)
        local o = opt_table("chat", opts, 2)
        local prompt = self:chat_tokenize(messages)
        local dec = textstream.new(_M.stops(self:chat_template(), o.stop))
        local gen = {}
        for k, v in next, o do
            if k ~= "stop" then
                gen[k] = v
            end
        end
        local next_tok, st, code = open_stream(self, "chat", prompt, gen, 2)
        if not next_tok then
            return nil, st, code
        end
        local ids, parts, one = {}, {}, {}
        for tok in next_tok, st do
            ids[#ids + 1] = tok
            one[1] = self:piece(tok)
            parts[#parts + 1] = dec:push(one, 1)
            if dec.stopped then
                break
            end
        end
        self:stream_close(st) -- stops generating now instead of when collected
        if not dec.stopped then
            local held, partial = dec:finish()
            parts[#parts + 1] = held .. partial
        end
        local text = concat(parts)
        return (text:gsub("^%s+", ""):gsub("%s+$", "")), ids
    end
end


return _M
