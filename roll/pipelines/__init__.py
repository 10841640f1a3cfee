"""roll.pipelines"""
